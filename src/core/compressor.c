#include "core/compressor.h"
#include "core/norm.h"
#include "core/numerics.h"
#include "core/rope.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int compressor_state_init(dsv4_compressor_state *s, const seq_mem *mem, int ratio, int width, int slack) {
    s->mem = mem;
    s->ratio = ratio;
    s->overlap = ratio == 4;
    s->width = width;
    s->cols = (s->overlap ? 2 : 1) * width;
    s->hist_len = (s->overlap ? 2 : 1) * ratio + (slack > 0 ? slack : 0);
    const size_t n = (size_t)s->hist_len * (size_t)s->cols;
    s->kv = mem->alloc(n * sizeof(float));
    s->score = mem->alloc(n * sizeof(float));
    if (!s->kv || !s->score) { compressor_state_free(s); return -1; }
    return 0;
}

void compressor_state_free(dsv4_compressor_state *s) {
    if (!s->mem) return;   /* never initialised */
    s->mem->release(s->kv);
    s->mem->release(s->score);
    s->kv = s->score = NULL;
}

void compressor_state_copy(dsv4_compressor_state *dst, const dsv4_compressor_state *src) {
    const size_t n = (size_t)src->hist_len * (size_t)src->cols * sizeof(float);
    dst->mem->copy(dst->kv, src->kv, n);
    dst->mem->copy(dst->score, src->score, n);
}

int64_t compressor_live_first(const dsv4_compressor_state *s, int64_t pos) {
    int64_t first = pos - pos % s->ratio - (s->overlap ? s->ratio : 0);
    return first < 0 ? 0 : first;
}

/* Softmax-weighted sum over the slots of output column j of the chunk [c0, c0+m). Slots in a fixed order:
 * the A half of the previous chunk's positions (when overlapping and the chunk exists), then the chunk's own
 * positions (their B half when overlapping). */
static float pool_column(const dsv4_compressor_state *s, int64_t c0, int j) {
    const int m = s->ratio, off = s->overlap ? s->width : 0;
    const int64_t a0 = s->overlap && c0 >= m ? c0 - m : c0;   /* first position with an A slot */
    float mx = -INFINITY;
    for (int64_t t = a0; t < c0; t++) mx = fmaxf(mx, compressor_score_at(s, t)[j]);
    for (int64_t t = c0; t < c0 + m; t++) mx = fmaxf(mx, compressor_score_at(s, t)[off + j]);
    float den = 0.0f, num = 0.0f;
    for (int64_t t = a0; t < c0; t++) {
        const float e = expf(compressor_score_at(s, t)[j] - mx);
        den += e;
        num += e * compressor_kv_at(s, t)[j];
    }
    for (int64_t t = c0; t < c0 + m; t++) {
        const float e = expf(compressor_score_at(s, t)[off + j] - mx);
        den += e;
        num += e * compressor_kv_at(s, t)[off + j];
    }
    return num / den;
}

int compressor_push(dsv4_compressor_state *s, const float *K, const float *Z, int64_t pos, float *pooled) {
    memcpy(compressor_kv_at(s, pos), K, sizeof(float) * (size_t)s->cols);
    memcpy(compressor_score_at(s, pos), Z, sizeof(float) * (size_t)s->cols);
    if ((pos + 1) % s->ratio != 0) return 0;
    const int64_t c0 = pos + 1 - s->ratio;
    for (int j = 0; j < s->width; j++) pooled[j] = pool_column(s, c0, j);
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
