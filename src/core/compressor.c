#include "core/compressor.h"
#include "core/norm.h"
#include "core/numerics.h"
#include "core/rope.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int compressor_state_init(dsv4_compressor_state *s, int ratio, int width) {
    const int coff = ratio == 4 ? 2 : 1;
    s->ratio = ratio;
    s->overlap = ratio == 4;
    s->width = width;
    s->rows = coff * ratio;
    s->cols = coff * width;
    const size_t n = (size_t)s->rows * (size_t)s->cols;
    s->kv = malloc(n * sizeof(float));
    s->score = malloc(n * sizeof(float));
    if (!s->kv || !s->score) { compressor_state_free(s); return -1; }
    compressor_state_reset(s);
    return 0;
}

void compressor_state_reset(dsv4_compressor_state *s) {
    const size_t n = (size_t)s->rows * (size_t)s->cols;
    memset(s->kv, 0, n * sizeof(float));
    for (size_t i = 0; i < n; i++) s->score[i] = -INFINITY;
}

void compressor_state_free(dsv4_compressor_state *s) {
    free(s->kv);
    free(s->score);
    s->kv = s->score = NULL;
}

size_t compressor_state_bytes(const dsv4_compressor_state *s) {
    return 2 * (size_t)s->rows * (size_t)s->cols * sizeof(float);
}

void compressor_state_copy(dsv4_compressor_state *dst, const dsv4_compressor_state *src) {
    const size_t n = (size_t)src->rows * (size_t)src->cols * sizeof(float);
    memcpy(dst->kv, src->kv, n);
    memcpy(dst->score, src->score, n);
}

/* Softmax-weighted sum over the slots of one output column j. Slots are visited in a fixed order: the A
 * half of the previous chunk (rows 0..m-1, column j), then the current chunk (rows, column off+j). */
static float pool_column(const dsv4_compressor_state *s, int j) {
    const int m = s->ratio, c = s->width, cols = s->cols;
    float mx = -INFINITY;
    if (s->overlap)
        for (int r = 0; r < m; r++) mx = fmaxf(mx, s->score[r * cols + j]);
    const int cur0 = s->overlap ? m : 0, off = s->overlap ? c : 0;
    for (int r = cur0; r < cur0 + m; r++) mx = fmaxf(mx, s->score[r * cols + off + j]);
    float den = 0.0f, num = 0.0f;
    if (s->overlap)
        for (int r = 0; r < m; r++) {
            const float e = expf(s->score[r * cols + j] - mx);   /* -inf (fresh state) -> weight 0 */
            den += e;
            num += e * s->kv[r * cols + j];
        }
    for (int r = cur0; r < cur0 + m; r++) {
        const float e = expf(s->score[r * cols + off + j] - mx);
        den += e;
        num += e * s->kv[r * cols + off + j];
    }
    return num / den;
}

int compressor_push(dsv4_compressor_state *s, const float *K, const float *Z, int64_t pos, float *pooled) {
    const int m = s->ratio, cols = s->cols;
    const int slot = (s->overlap ? m : 0) + (int)(pos % m);
    memcpy(s->kv + (size_t)slot * cols, K, sizeof(float) * (size_t)cols);
    memcpy(s->score + (size_t)slot * cols, Z, sizeof(float) * (size_t)cols);
    if ((pos + 1) % m != 0) return 0;
    for (int j = 0; j < s->width; j++) pooled[j] = pool_column(s, j);
    if (s->overlap) {
        /* the chunk just completed becomes the "previous chunk" of the next one */
        memcpy(s->kv, s->kv + (size_t)m * cols, sizeof(float) * (size_t)m * cols);
        memcpy(s->score, s->score + (size_t)m * cols, sizeof(float) * (size_t)m * cols);
    }
    return 1;
}

void compressor_finish_row(dsv4_mode mode, const dsv4_compressor_weights *w, const dsv4_rope *rope, int rope_dim,
                           float eps, int is_indexer, int64_t chunk_start, float *row) {
    const int c = w->width;
    num_bf16(mode, row, c);
    rmsnorm(mode, row, w->norm, c, eps, row);
    rope_apply(mode, rope, rope_dim, row + c - rope_dim, chunk_start, 0);
    if (!is_official(mode)) return;
    if (is_indexer) {
        hadamard_inplace(row, c);
        num_bf16(mode, row, c);
        act_quant_fp4_inplace(row, c, 32);
    } else {
        act_quant_fp8_inplace(row, c - rope_dim, 64);
    }
}
