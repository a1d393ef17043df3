#include "core/hc.h"
#include "backend/cpu/kernels.h"
#include "core/numerics.h"
#include "core/sinkhorn.h"
#include <math.h>
#include <string.h>

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* 1/rms of nt <= RMS_GROUP rows of n values (ld apart): each row's sum is its own chain s = s + x[i]^2 over
 * i = 0 .. n-1 from 0.0f, as inv_rms's, the square rounded (-ffp-contract=off: never fused into the add). The rows'
 * chains are interleaved so that they run side by side: one chain is n dependent adds (~5 us for Flash's 16,384
 * values), and a step of many tokens ran them one after another. */
enum { RMS_GROUP = 8 };
static void inv_rms_rows(const float *X, int64_t ld, int nt, int n, float eps, float *r) {
    float s[RMS_GROUP] = { 0 };
    const float *x[RMS_GROUP];
    for (int t = 0; t < RMS_GROUP; t++) x[t] = X + (t < nt ? t : 0) * ld;   /* rows past nt: computed, dropped */
    for (int i = 0; i < n; i++)
        for (int t = 0; t < RMS_GROUP; t++) s[t] = s[t] + x[t][i] * x[t][i];
    for (int t = 0; t < nt; t++) r[t] = 1.0f / sqrtf(s[t] / (float)n + eps);
}
static float inv_rms(const float *x, int n, float eps) {   /* one row: inv_rms_rows' chain */
    float s = 0.0f;
    for (int i = 0; i < n; i++) s = s + x[i] * x[i];
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
    float rg[RMS_GROUP];
    for (int t = t0; t < t1; t++) {
        const float *x = X + (int64_t)t * n;
        float *m = scratch + (int64_t)t * nmix;
        if ((t - t0) % RMS_GROUP == 0)
            inv_rms_rows(x, n, t1 - t < RMS_GROUP ? t1 - t : RMS_GROUP, n, c->norm_eps, rg);
        const float r = rg[(t - t0) % RMS_GROUP];
        for (int j = 0; j < nmix; j++) m[j] *= r;
        float pre[8];
        for (int i = 0; i < hc; i++) pre[i] = sigmoidf(fmaf(m[i], w->scale[0], w->base[i])) + c->hc_eps;
        for (int i = 0; i < hc; i++) mix[t].post[i] = 2.0f * sigmoidf(fmaf(m[hc + i], w->scale[1], w->base[hc + i]));
        float *C = mix[t].comb;
        for (int j = 0; j < hc * hc; j++) C[j] = fmaf(m[2 * hc + j], w->scale[2], w->base[2 * hc + j]);
        hc_sinkhorn(C, hc, c->hc_iters, c->hc_eps);
        /* ut[e] = fmaf(pre[i], x[i][e], .) over i = 0 .. hc-1 in order from 0.0f (how GCC contracted the scalar
         * loop this replaced; written out so that it no longer depends on the compiler): a stream at a time over the
         * row, so the compiler runs 16 elements an instruction, each lane the same chain */
        float *ut = u + (int64_t)t * d;
        for (int e = 0; e < d; e++) ut[e] = fmaf(pre[0], x[e], 0.0f);
        for (int i = 1; i < hc; i++) {
            const float pi = pre[i], *xi = x + (int64_t)i * d;
            for (int e = 0; e < d; e++) ut[e] = fmaf(pi, xi[e], ut[e]);
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
    float y[8][HC_POST_COLS];   /* the unit's new streams: each reads every old one, so they are written back at the end */
    for (int u = u0; u < u1; u++) {
        const int t = u / jb->blocks, e0 = u % jb->blocks * HC_POST_COLS, n = e0 + HC_POST_COLS < d ? HC_POST_COLS : d - e0;
        float *x = jb->X + (int64_t)t * hc * d + e0;
        const float *ft = jb->f + (int64_t)t * d + e0;
        const dsv4_hc_mix *mx = &jb->mix[t];
        /* stream k, element e: s = fmaf(post[k], f[e], comb[0][k] old[0][e]), then s = fmaf(comb[j][k], old[j][e], s)
         * for j = 1 .. hc-1 in order, then bf16 (OFFICIAL). (That is how GCC contracted the scalar loop this replaced,
         * s = post f; s += comb old for each j; written out so that it no longer depends on the compiler.) A stream
         * at a time over the block, so the compiler runs 16 elements an instruction, each lane the same chain. */
        for (int k = 0; k < hc; k++) {
            float *yk = y[k];
            const float pk = mx->post[k], c0k = mx->comb[k];
            for (int e = 0; e < n; e++) yk[e] = fmaf(pk, ft[e], c0k * x[e]);
            for (int j = 1; j < hc; j++) {
                const float cjk = mx->comb[j * hc + k], *xj = x + (int64_t)j * d;
                for (int e = 0; e < n; e++) yk[e] = fmaf(cjk, xj[e], yk[e]);
            }
        }
        for (int k = 0; k < hc; k++) {
            num_bf16(jb->mode, y[k], n);
            memcpy(x + (int64_t)k * d, y[k], sizeof(float) * (size_t)n);
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
        wt[i] = sigmoidf(fmaf(mixi, w->scale[0], w->base[i])) + c->hc_eps;
    }
    for (int e = 0; e < d; e++) {
        float s = 0.0f;
        for (int i = 0; i < hc; i++) s = fmaf(wt[i], X[i * d + e], s);
        y[e] = s;
    }
    num_bf16(mode, y, d);
}
