#include "testweight.h"
#include "model/formats.h"
#include <stdlib.h>

uint32_t tw_rnd(uint32_t *rng) {
    *rng = *rng * 1664525u + 1013904223u;
    return *rng >> 8;
}

float tw_rndf(uint32_t *rng) { return (float)tw_rnd(rng) / (float)(1u << 24) * 2.0f - 1.0f; }

test_weight tw_make(dsv4_wfmt fmt, int rows, int cols, int big_scale, uint32_t *rng) {
    test_weight t = {0};
    t.w.fmt = fmt;
    t.w.rows = rows;
    t.w.cols = cols;
    size_t nbytes = 0;
    switch (fmt) {
    case WF_F32: nbytes = sizeof(float) * (size_t)rows * cols; break;
    case WF_BF16: nbytes = 2 * (size_t)rows * cols; break;
    case WF_FP8: nbytes = (size_t)rows * cols; t.w.scale_cols = (cols + 127) / 128; break;
    case WF_FP4:
    case WF_FP4P: nbytes = (size_t)rows * cols / 2; t.w.scale_cols = cols / 32; break;   /* FP4P: fp4_planes_weight after */
    }
    t.data = malloc(nbytes);
    if (!t.data) return t;
    if (fmt == WF_F32) for (size_t i = 0; i < (size_t)rows * cols; i++) ((float *)t.data)[i] = tw_rndf(rng);
    else if (fmt == WF_BF16) for (size_t i = 0; i < (size_t)rows * cols; i++) ((uint16_t *)t.data)[i] = f32_to_bf16(tw_rndf(rng));
    else for (size_t i = 0; i < nbytes; i++) {
        uint8_t b = (uint8_t)tw_rnd(rng);
        if (fmt == WF_FP8 && (b & 0x7f) == 0x7f) b ^= 1;   /* no NaN codes in weights */
        if (big_scale) b &= 0xbf;
        ((uint8_t *)t.data)[i] = b;
    }
    if (fmt == WF_FP8 || fmt == WF_FP4 || fmt == WF_FP4P) {
        const int srows = fmt == WF_FP8 ? (rows + 127) / 128 : rows;
        t.scale = malloc((size_t)srows * t.w.scale_cols);
        if (!t.scale) { free(t.data); t.data = NULL; return t; }
        for (int i = 0; i < srows * t.w.scale_cols; i++) t.scale[i] = (uint8_t)(big_scale && i % 2 ? 247 : 120 + tw_rnd(rng) % 12);
    }
    t.w.data = t.data;
    t.w.scale = t.scale;
    return t;
}

void tw_free(test_weight *t) {
    free(t->data);
    free(t->scale);
    t->data = NULL;
    t->scale = NULL;
}
