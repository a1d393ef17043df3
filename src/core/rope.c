#include "core/rope.h"
#include "core/numerics.h"
#include <math.h>

void rope_apply(dsv4_mode mode, const dsv4_rope *r, int rope_dim, float *x, int64_t pos, int inverse) {
    const float p = (float)pos;
    for (int i = 0; i < rope_dim / 2; i++) {
        const float theta = p * r->freq[i];   /* fp32 product, as the official table */
        const float c = cosf(theta), s = inverse ? -sinf(theta) : sinf(theta);
        const float re = x[2 * i], im = x[2 * i + 1];
        x[2 * i] = num_bf16_1(mode, re * c - im * s);
        x[2 * i + 1] = num_bf16_1(mode, re * s + im * c);
    }
}
