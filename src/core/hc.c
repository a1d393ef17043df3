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

/* One hc_pre call's per-token work, spread over the pool by token (each token's values computed by the same code
 * whatever thread takes it). */
typedef struct {
    dsv4_mode mode;
    const dsv4_config *c;
    const dsv4_hc_weights *w;
    const float *X;
    float *u, *scratch;
    dsv4_hc_mix *mix;
} hc_pre_job;

static void hc_pre_tokens(void *ctx, int t0, int t1, int thread) {
    (void)thread;
    const hc_pre_job *jb = ctx;
    const dsv4_config *c = jb->c;
    const dsv4_hc_weights *w = jb->w;
    const dsv4_mode mode = jb->mode;
    const float *X = jb->X;
    float *u = jb->u, *scratch = jb->scratch;
    dsv4_hc_mix *mix = jb->mix;
    const int hc = c->hc_mult, d = c->dim, n = hc * d, nmix = hc_mix_count(hc);
    for (int t = t0; t < t1; t++) {
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

void hc_pre(dsv4_pool *pool, dsv4_mode mode, const dsv4_config *c, const dsv4_hc_weights *w, const float *X, int T,
            float *u, dsv4_hc_mix *mix, float *scratch) {
    const int n = c->hc_mult * c->dim;
    /* linear first, then scale by 1/rms (official order) */
    cpu_linear(pool, &w->fn, X, T, n, scratch, hc_mix_count(c->hc_mult));
    hc_pre_job j = { mode, c, w, X, u, scratch, mix };
    dsv4_pool_run(pool, T, hc_pre_tokens, &j);
}

/* hc_post's work in units of HC_POST_COLS columns of one token (unit u: token u / blocks, columns of block u % blocks),
 * spread over the pool; every element is computed by the same code whatever unit or thread holds it. */
enum { HC_POST_COLS = 512 };
typedef struct {
    dsv4_mode mode;
    const dsv4_config *c;
    const float *f;
    const dsv4_hc_mix *mix;
    float *X;
    int blocks;
} hc_post_job;

static void hc_post_units(void *ctx, int u0, int u1, int thread) {
    (void)thread;
    const hc_post_job *jb = ctx;
    const int hc = jb->c->hc_mult, d = jb->c->dim;
    float old[8];
    for (int u = u0; u < u1; u++) {
        const int t = u / jb->blocks, e0 = u % jb->blocks * HC_POST_COLS, e1 = e0 + HC_POST_COLS < d ? e0 + HC_POST_COLS : d;
        float *x = jb->X + (int64_t)t * hc * d;
        const float *ft = jb->f + (int64_t)t * d;
        const dsv4_hc_mix *mx = &jb->mix[t];
        for (int e = e0; e < e1; e++) {
            for (int j = 0; j < hc; j++) old[j] = x[j * d + e];
            for (int k = 0; k < hc; k++) {
                float s = mx->post[k] * ft[e];
                for (int j = 0; j < hc; j++) s += mx->comb[j * hc + k] * old[j];
                x[k * d + e] = num_bf16_1(jb->mode, s);
            }
        }
    }
}

void hc_post(dsv4_pool *pool, dsv4_mode mode, const dsv4_config *c, const float *f, const dsv4_hc_mix *mix, float *X, int T) {
    hc_post_job j = { mode, c, f, mix, X, (c->dim + HC_POST_COLS - 1) / HC_POST_COLS };
    dsv4_pool_run(pool, T * j.blocks, hc_post_units, &j);
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
