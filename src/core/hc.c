#include "core/hc.h"
#include "backend/cpu/kernels.h"
#include "core/numerics.h"
#include "core/sinkhorn.h"
#include <math.h>
#include <string.h>

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

static float inv_rms(const float *x, int n, float eps) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += x[i] * x[i];
    return 1.0f / sqrtf(s / (float)n + eps);
}

void hc_sinkhorn(float *C, int n, int iters, float eps) { sinkhorn_inplace(C, n, iters, eps); }

void hc_pre(dsv4_pool *pool, dsv4_mode mode, const dsv4_config *c, const dsv4_hc_weights *w, const float *X, int T,
            float *u, dsv4_hc_mix *mix, float *scratch) {
    const int hc = c->hc_mult, d = c->dim, n = hc * d, nmix = hc_mix_count(hc);
    /* linear first, then scale by 1/rms (official order) */
    cpu_linear(pool, &w->fn, X, T, n, scratch, nmix);
    for (int t = 0; t < T; t++) {
        const float *x = X + (int64_t)t * n;
        float *m = scratch + (int64_t)t * nmix;
        const float r = inv_rms(x, n, c->norm_eps);
        for (int j = 0; j < nmix; j++) m[j] *= r;
        float pre[8];
        for (int i = 0; i < hc; i++) pre[i] = sigmoidf(m[i] * w->scale[0] + w->base[i]) + c->hc_eps;
        for (int i = 0; i < hc; i++) mix[t].post[i] = 2.0f * sigmoidf(m[hc + i] * w->scale[1] + w->base[hc + i]);
        float *C = mix[t].comb;
        for (int j = 0; j < hc * hc; j++) C[j] = m[2 * hc + j] * w->scale[2] + w->base[2 * hc + j];
        hc_sinkhorn(C, hc, c->hc_iters, c->hc_eps);
        float *ut = u + (int64_t)t * d;
        for (int e = 0; e < d; e++) {
            float s = 0.0f;
            for (int i = 0; i < hc; i++) s += pre[i] * x[i * d + e];
            ut[e] = s;
        }
        num_bf16(mode, ut, d);
    }
}

void hc_post(dsv4_mode mode, const dsv4_config *c, const float *f, const dsv4_hc_mix *mix, float *X, int T) {
    const int hc = c->hc_mult, d = c->dim;
    float old[8];
    for (int t = 0; t < T; t++) {
        float *x = X + (int64_t)t * hc * d;
        const float *ft = f + (int64_t)t * d;
        const dsv4_hc_mix *mx = &mix[t];
        for (int e = 0; e < d; e++) {
            for (int j = 0; j < hc; j++) old[j] = x[j * d + e];
            for (int k = 0; k < hc; k++) {
                float s = mx->post[k] * ft[e];
                for (int j = 0; j < hc; j++) s += mx->comb[j * hc + k] * old[j];
                x[k * d + e] = num_bf16_1(mode, s);
            }
        }
    }
}

void hc_head_one(dsv4_mode mode, const dsv4_config *c, const dsv4_hc_weights *w, const float *X, float *y) {
    const int hc = c->hc_mult, d = c->dim, n = hc * d;
    const float r = inv_rms(X, n, c->norm_eps);
    float wt[8];
    for (int i = 0; i < hc; i++) {
        const float mixi = dot_f32((const float *)w->fn.data + (int64_t)i * n, X, n) * r;
        wt[i] = sigmoidf(mixi * w->scale[0] + w->base[i]) + c->hc_eps;
    }
    for (int e = 0; e < d; e++) {
        float s = 0.0f;
        for (int i = 0; i < hc; i++) s += wt[i] * X[i * d + e];
        y[e] = s;
    }
    num_bf16(mode, y, d);
}
