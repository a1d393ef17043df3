#include "core/moe.h"
#include "backend/cpu/kernels.h"
#include "core/numerics.h"
#include "model/footprint.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* torch's softplus threshold: x above 20 is returned as is. */
static inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static inline float siluf(float x) { return x / (1.0f + expf(-x)); }

/* Pick the k experts with the largest biased score; ties go to the lower expert id. */
static void top_k_experts(const float *score, const float *bias, int E, int k, int32_t *out) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        float bv = 0.0f;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= out[q] == e;
            if (taken) continue;
            const float v = score[e] + (bias ? bias[e] : 0.0f);
            if (best < 0 || v > bv) { best = e; bv = v; }
        }
        out[j] = best;
    }
}

/* Router for every token: which experts, with which weights (spec §11.1). */
static void route(struct dsv4_model *m, const dsv4_layer *layer, dsv4_workspace *ws) {
    const dsv4_config *c = &m->cfg;
    const int T = ws->batch.T, E = c->n_routed, K = c->n_act;
    cpu_linear(m->pool, &layer->gate, ws->xn, T, c->dim, ws->router, E);
    for (int t = 0; t < T; t++) {
        float *s = ws->router + (int64_t)t * E;
        for (int e = 0; e < E; e++) s[e] = sqrtf(softplusf(s[e]));
        int32_t *sel = ws->route_e + (int64_t)t * K;
        if (layer->hash_routed) memcpy(sel, layer->tid2eid + (int64_t)ws->batch.tok[t] * K, sizeof(int32_t) * K);
        else top_k_experts(s, layer->gate_bias, E, K, sel);
        float *w = ws->route_w + (int64_t)t * K, sum = 0.0f;
        for (int j = 0; j < K; j++) sum += s[sel[j]];
        for (int j = 0; j < K; j++) w[j] = s[sel[j]] / sum * c->route_scale;
        if (layer->route_counts)
            for (int j = 0; j < K; j++) layer->route_counts[sel[j]] += moe_first_slot(sel, j);
    }
}

/* The buffers one expert runs in: gathered inputs x [n][d] (quantized in place in OFFICIAL mode), gate / up
 * g, v [n][I], outputs y [n][d]. */
typedef struct {
    float *x, *g, *v, *y;
} expert_bufs;

/* One SwiGLU expert over n gathered tokens: b->x [n][d] -> b->y [n][d]. `weight` (or NULL for the shared
 * expert) multiplies the activation before the down projection, as the official code does. */
static void expert(struct dsv4_model *m, const dsv4_weight *w1, const dsv4_weight *w2, const dsv4_weight *w3,
                   int n, const float *weight, const expert_bufs *b) {
    const dsv4_config *c = &m->cfg;
    const int d = c->dim, I = c->moe_inter;
    const dsv4_mode mode = m->mode;
    const float lim = c->swiglu_limit;
    float *x = b->x;
    if (is_official(mode)) {
        /* FP8/FP4 linears quantize their input rows per 128 columns; q*s is exact in bf16, so the simulated
         * value equals what the FP8 GEMM multiplies */
        for (int t = 0; t < n; t++) act_quant_fp8_inplace(x + (int64_t)t * d, d, 128);
    }
    linear_quantized_in(m->amx, m->pool, w1, x, n, d, b->g, I);
    linear_quantized_in(m->amx, m->pool, w3, x, n, d, b->v, I);
    num_bf16(mode, b->g, (long)n * I);
    num_bf16(mode, b->v, (long)n * I);
    for (int t = 0; t < n; t++) {
        float *g = b->g + (int64_t)t * I, *v = b->v + (int64_t)t * I;
        for (int i = 0; i < I; i++) {
            float gi = g[i], vi = v[i];
            if (lim > 0.0f) {
                gi = fminf(gi, lim);
                vi = fminf(fmaxf(vi, -lim), lim);
            }
            float h = siluf(gi) * vi;
            if (weight) h *= weight[t];
            g[i] = h;
        }
    }
    num_bf16(mode, b->g, (long)n * I);
    if (is_official(mode))
        for (int t = 0; t < n; t++) act_quant_fp8_inplace(b->g + (int64_t)t * I, I, 128);
    linear_quantized_in(m->amx, m->pool, w2, b->g, n, I, b->y, d);
    num_bf16(mode, b->y, (long)n * d);
}

void moe_forward(struct dsv4_model *m, const dsv4_layer *layer, dsv4_workspace *ws) {
    const dsv4_config *c = &m->cfg;
    const int T = ws->batch.T, d = c->dim, K = c->n_act;
    route(m, layer, ws);
    const expert_bufs b = { ws->ex, ws->eg, ws->ev, ws->ey };
    memset(ws->acc, 0, sizeof(float) * (size_t)T * d);
    /* experts in increasing id: each token's sum runs in that order however the tokens are grouped */
    for (int e = 0; e < c->n_routed; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (ws->route_e[(int64_t)t * K + j] == e) {
                    /* a table row naming e twice counts once (the official indexed update keeps one write) */
                    ws->expert_tok[n] = t;
                    ws->expert_w[n] = ws->route_w[(int64_t)t * K + j];
                    memcpy(ws->ex + (int64_t)n * d, ws->xn + (int64_t)t * d, sizeof(float) * d);
                    n++;
                    break;
                }
        if (!n) continue;
        m->routed_bytes += dsv4_expert_weight_bytes(layer, e);
        expert(m, &layer->w1[e], &layer->w2[e], &layer->w3[e], n, ws->expert_w, &b);
        for (int i = 0; i < n; i++) {
            float *a = ws->acc + (int64_t)ws->expert_tok[i] * d;
            const float *y = ws->ey + (int64_t)i * d;
            for (int k = 0; k < d; k++) a[k] += y[k];
        }
    }
    memcpy(ws->ex, ws->xn, sizeof(float) * (size_t)T * d);
    expert(m, &layer->sw1, &layer->sw2, &layer->sw3, T, NULL, &b);
    for (int t = 0; t < T; t++) {
        float *a = ws->acc + (int64_t)t * d;
        const float *y = ws->ey + (int64_t)t * d;
        float *out = ws->sub + (int64_t)t * d;
        for (int k = 0; k < d; k++) out[k] = num_bf16_1(m->mode, a[k] + y[k]);
    }
}

int moe_pair_offsets(const int32_t *route_e, int T, int K, int E, int32_t *first) {
    memset(first, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int64_t i = 0; i < (int64_t)T * K; i++)
        if (moe_first_slot(route_e + i / K * K, (int)(i % K))) first[route_e[i] + 1]++;
    for (int e = 0; e < E; e++) first[e + 1] += first[e];
    return first[E];
}

int moe_host_rows(struct dsv4_model *m, const dsv4_layer *layer, const uint8_t *on_host, const float *xn,
                  const int32_t *route_e, const float *route_w, int T, moe_host_scratch *scr, float *rows, int32_t *pair) {
    const dsv4_config *c = &m->cfg;
    const int d = c->dim, K = c->n_act, E = c->n_routed;
    moe_pair_offsets(route_e, T, K, E, scr->first);
    int n_rows = 0;
    for (int e = 0; e < E; e++) {
        if (!on_host[e] || scr->first[e + 1] == scr->first[e]) continue;
        /* the pairs of e in token order: pair index first[e] + r for the r-th, as the GPU's plan numbers them */
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (route_e[(int64_t)t * K + j] == e) {
                    memcpy(scr->x + (int64_t)n * d, xn + (int64_t)t * d, sizeof(float) * d);
                    scr->w[n] = route_w[(int64_t)t * K + j];
                    pair[n_rows + n] = scr->first[e] + n;
                    n++;
                    break;   /* a row naming e twice counts once */
                }
        m->routed_bytes += dsv4_expert_weight_bytes(layer, e);
        const expert_bufs b = { scr->x, scr->g, scr->v, rows + (int64_t)n_rows * d };
        expert(m, &layer->w1[e], &layer->w2[e], &layer->w3[e], n, scr->w, &b);
        n_rows += n;
    }
    return n_rows;
}

int moe_host_scratch_init(moe_host_scratch *scr, const dsv4_config *c, int T) {
    memset(scr, 0, sizeof *scr);
    scr->x = malloc(sizeof(float) * (size_t)T * c->dim);
    scr->g = malloc(sizeof(float) * (size_t)T * c->moe_inter);
    scr->v = malloc(sizeof(float) * (size_t)T * c->moe_inter);
    scr->w = malloc(sizeof(float) * (size_t)T);
    scr->first = malloc(sizeof(int32_t) * (size_t)(c->n_routed + 1));
    scr->T_cap = T;
    if (scr->x && scr->g && scr->v && scr->w && scr->first) return 0;
    moe_host_scratch_free(scr);
    return -1;
}

void moe_host_scratch_free(moe_host_scratch *scr) {
    free(scr->x);
    free(scr->g);
    free(scr->v);
    free(scr->w);
    free(scr->first);
    memset(scr, 0, sizeof *scr);
}
