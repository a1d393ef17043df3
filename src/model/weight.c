#include "model/weight.h"
#include <string.h>

dsv4_weight weight_rows(const dsv4_weight *w, int r0, int n) {
    dsv4_weight v = *w;
    v.rows = n;
    v.row0 = w->row0 + r0;
    switch (w->fmt) {
    case WF_F32: v.data = (const float *)w->data + (int64_t)r0 * w->cols; break;
    case WF_BF16: v.data = (const uint16_t *)w->data + (int64_t)r0 * w->cols; break;
    case WF_FP8: v.data = (const uint8_t *)w->data + (int64_t)r0 * w->cols; break;
    case WF_FP4:
    case WF_FP4P: v.data = (const uint8_t *)w->data + (int64_t)r0 * (w->cols / 2); break;
    }
    return v;
}

uint64_t weight_cols_bytes(const dsv4_weight *w, int64_t ncols) {
    const uint64_t n = (uint64_t)ncols;
    switch (w->fmt) {
    case WF_F32: return n * 4;
    case WF_BF16: return n * 2;
    case WF_FP8: return n;
    case WF_FP4:
    case WF_FP4P: return n / 2;
    }
    return 0;
}

uint64_t weight_bytes(const dsv4_weight *w) { return weight_cols_bytes(w, (int64_t)w->rows * w->cols); }

uint64_t weight_scale_bytes(const dsv4_weight *w) {
    if (w->fmt == WF_FP8) return (uint64_t)((w->rows + 127) / 128) * (uint64_t)w->scale_cols;
    if (w->fmt == WF_FP4 || w->fmt == WF_FP4P) return (uint64_t)w->rows * (uint64_t)w->scale_cols;
    return 0;
}

