#include "core/norm.h"
#include "core/numerics.h"
#include <math.h>

/* s = s + x[i]^2 over i = 0 .. n-1 from 0.0f, the square rounded (never fused: -ffp-contract=off), then / n */
static float mean_square(const float *x, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    return s / (float)n;
}

void rmsnorm(dsv4_mode mode, const float *x, const float *w, int n, float eps, float *y) {
    const float r = 1.0f / sqrtf(mean_square(x, n) + eps);
    for (int i = 0; i < n; i++) y[i] = w[i] * (x[i] * r);
    num_bf16(mode, y, n);
}

void unit_rmsnorm(dsv4_mode mode, float *x, int n, float eps) {
    if (!is_official(mode)) {
        const float r = 1.0f / sqrtf(mean_square(x, n) + eps);
        for (int i = 0; i < n; i++) x[i] *= r;
        return;
    }
    /* Official: every operation on BF16 tensors (the square, the mean — accumulated in fp32 and rounded —
     * the eps add, the rsqrt and the product). */
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += round_bf16(x[i] * x[i]);
    float ms = round_bf16(s / (float)n);
    float r = round_bf16(1.0f / sqrtf(round_bf16(ms + eps)));
    for (int i = 0; i < n; i++) x[i] = round_bf16(x[i] * r);
}
