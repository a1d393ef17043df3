#include "model/weight.h"
#include "model/formats.h"
#include <string.h>

dsv4_weight weight_rows(const dsv4_weight *w, int r0, int n) {
    dsv4_weight v = *w;
    v.rows = n;
    v.row0 = w->row0 + r0;
    switch (w->fmt) {
    case WF_F32: v.data = (const float *)w->data + (int64_t)r0 * w->cols; break;
    case WF_BF16: v.data = (const uint16_t *)w->data + (int64_t)r0 * w->cols; break;
    case WF_FP8: v.data = (const uint8_t *)w->data + (int64_t)r0 * w->cols; break;
    case WF_FP4: v.data = (const uint8_t *)w->data + (int64_t)r0 * (w->cols / 2); break;
    }
    return v;
}

uint64_t weight_bytes(const dsv4_weight *w) {
    uint64_t n = (uint64_t)w->rows * (uint64_t)w->cols;
    switch (w->fmt) {
    case WF_F32: return n * 4;
    case WF_BF16: return n * 2;
    case WF_FP8: return n;
    case WF_FP4: return n / 2;
    }
    return 0;
}

void weight_decode_row(const dsv4_weight *w, int row, float *out) {
    const int n = w->cols;
    switch (w->fmt) {
    case WF_F32:
        memcpy(out, (const float *)w->data + (int64_t)row * n, sizeof(float) * (size_t)n);
        break;
    case WF_BF16: {
        const uint16_t *src = (const uint16_t *)w->data + (int64_t)row * n;
        for (int i = 0; i < n; i++) out[i] = bf16_to_f32(src[i]);
        break;
    }
    case WF_FP8: {
        const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * n;
        const uint8_t *srow = w->scale + (int64_t)((w->row0 + row) / 128) * w->scale_cols;
        for (int b = 0; b < n; b += 128) {
            const float s = e8m0_to_f32(srow[b / 128]);
            const int end = b + 128 < n ? b + 128 : n;
            for (int i = b; i < end; i++) out[i] = dsv4_e4m3_table[src[i]] * s;
        }
        break;
    }
    case WF_FP4: {
        const uint8_t *src = (const uint8_t *)w->data + (int64_t)row * (n / 2);
        const uint8_t *srow = w->scale + (int64_t)(w->row0 + row) * w->scale_cols;
        for (int b = 0; b < n; b += 32) {
            const float s = e8m0_to_f32(srow[b / 32]);
            for (int i = b; i < b + 32 && i < n; i += 2) {
                uint8_t byte = src[i / 2];
                out[i] = dsv4_e2m1_table[byte & 15] * s;
                out[i + 1] = dsv4_e2m1_table[byte >> 4] * s;
            }
        }
        break;
    }
    }
}
