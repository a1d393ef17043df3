/* The rows of one linear (cpu_linear's worker; compiled once per instruction set, isa.h). */
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/tile.h"
#include <stdlib.h>

static inline float *out_at(const cpu_linear_job *j, int t, int o) {
    return j->y_rows ? j->y_rows[t] + o : j->y + (int64_t)t * j->ldy + o;
}

/* One token reads every weight byte once, so decode is a stream from memory: the row PREFETCH_ROWS ahead is
 * requested while this one is dotted. Without it the hardware prefetcher alone left the dots waiting on
 * memory (a one-thread test: FP4 and BF16 rows 10-30 % slower). Prefetching moves no result. */
enum { PREFETCH_ROWS = 2 };

/* Rows per thread are contiguous. With one token each row is dotted as it is decoded (weight_dot_row); with
 * more, TILE_R rows are decoded once into a small buffer and multiplied with the tokens TILE_T at a time by
 * the tile kernel (tile.h). Every output element gets dot_f32's reduction order on either path, so the bits
 * do not depend on T, on the chunking, on the thread count or on the instruction set. */
void ISA_FN(linear_rows)(void *ctx, int begin, int end, int thread) {
    cpu_linear_job *j = ctx;
    const int cols = j->w->cols;
    /* TILE_R decoded rows for the tile kernel; with one token, a row for weight_dot_row and the prepared x */
    enum { SCRATCH_ROWS = TILE_R > 2 ? TILE_R : 2 };
    float stackbuf[32768]; /* 128 KiB: SCRATCH_ROWS rows of up to 8192 columns */
    float *scratch = (size_t)cols * SCRATCH_ROWS <= 32768 ? stackbuf : malloc(sizeof(float) * (size_t)cols * SCRATCH_ROWS);
    if (!scratch) return; /* cannot happen for real configs; leaves y untouched rather than crash */
    if (j->T == 1) {   /* decode: fused, each weight read once straight into the FMAs */
        const float *xp = ISA_FN(weight_dot_prepare)(j->w, j->x, scratch + cols);
        const size_t row_bytes = weight_cols_bytes(j->w, cols);
        for (int o = begin; o < end; o++) {
            if (o + PREFETCH_ROWS < end)
                prefetch_bytes((const char *)j->w->data + (size_t)(o + PREFETCH_ROWS) * row_bytes, row_bytes);
            *out_at(j, 0, o) = xp ? ISA_FN(weight_dot_prepared)(j->w, o, xp) : ISA_FN(weight_dot_row)(j->w, o, j->x, scratch);
        }
        if (scratch != stackbuf) free(scratch);
        return;
    }
    for (int o0 = begin; o0 < end; o0 += TILE_R) {
        const int nr = end - o0 < TILE_R ? end - o0 : TILE_R;
        const float *wr[TILE_R];
        for (int r = 0; r < TILE_R; r++) {
            if (r >= nr && r > 0) { wr[r] = wr[r - 1]; continue; }   /* a partial tile repeats its last row */
            if (j->w->fmt == WF_F32) wr[r] = (const float *)j->w->data + (int64_t)(o0 + r) * cols;
            else {
                ISA_FN(weight_decode_row)(j->w, o0 + r, scratch + (size_t)r * cols);
                wr[r] = scratch + (size_t)r * cols;
            }
        }
        for (int t0 = 0; t0 < j->T; t0 += TILE_T) {
            const int nt = j->T - t0 < TILE_T ? j->T - t0 : TILE_T;
            const float *xs[TILE_T];
            for (int t = 0; t < TILE_T; t++) xs[t] = j->x + (int64_t)(t0 + (t < nt ? t : nt - 1)) * j->ldx;
            float out[TILE_R * TILE_T];
            ISA_FN(tile_dot_f32)(wr, xs, cols, out);
            for (int r = 0; r < nr; r++)
                for (int t = 0; t < nt; t++) *out_at(j, t0 + t, o0 + r) = out[r * TILE_T + t];
        }
    }
    if (scratch != stackbuf) free(scratch);
}
