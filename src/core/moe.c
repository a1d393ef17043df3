#include "core/moe.h"
#include "backend/cpu/kernels.h"
#include "core/numerics.h"
#include "model/footprint.h"
#include <math.h>
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
    }
}

/* One SwiGLU expert over n gathered tokens: ws->ex [n][d] -> ws->ey [n][d]. `weight` (or NULL for the shared
 * expert) multiplies the activation before the down projection, as the official code does. */
static void expert(struct dsv4_model *m, const dsv4_weight *w1, const dsv4_weight *w2, const dsv4_weight *w3,
                   int n, const float *weight, dsv4_workspace *ws) {
    const dsv4_config *c = &m->cfg;
    const int d = c->dim, I = c->moe_inter;
    const dsv4_mode mode = m->mode;
    const float lim = c->swiglu_limit;
    float *x = ws->ex;
    if (is_official(mode)) {
        /* FP8/FP4 linears quantize their input rows per 128 columns; q*s is exact in bf16, so the simulated
         * value equals what the FP8 GEMM multiplies */
        for (int t = 0; t < n; t++) act_quant_fp8_inplace(x + (int64_t)t * d, d, 128);
    }
    linear_quantized_in(m->amx, m->pool, w1, x, n, d, ws->eg, I);
    linear_quantized_in(m->amx, m->pool, w3, x, n, d, ws->ev, I);
    num_bf16(mode, ws->eg, (long)n * I);
    num_bf16(mode, ws->ev, (long)n * I);
    for (int t = 0; t < n; t++) {
        float *g = ws->eg + (int64_t)t * I, *v = ws->ev + (int64_t)t * I;
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
    num_bf16(mode, ws->eg, (long)n * I);
    if (is_official(mode))
        for (int t = 0; t < n; t++) act_quant_fp8_inplace(ws->eg + (int64_t)t * I, I, 128);
    linear_quantized_in(m->amx, m->pool, w2, ws->eg, n, I, ws->ey, d);
    num_bf16(mode, ws->ey, (long)n * d);
}

void moe_forward(struct dsv4_model *m, const dsv4_layer *layer, dsv4_workspace *ws) {
    const dsv4_config *c = &m->cfg;
    const int T = ws->batch.T, d = c->dim, K = c->n_act;
    route(m, layer, ws);
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
        expert(m, &layer->w1[e], &layer->w2[e], &layer->w3[e], n, ws->expert_w, ws);
        for (int i = 0; i < n; i++) {
            float *a = ws->acc + (int64_t)ws->expert_tok[i] * d;
            const float *y = ws->ey + (int64_t)i * d;
            for (int k = 0; k < d; k++) a[k] += y[k];
        }
    }
    memcpy(ws->ex, ws->xn, sizeof(float) * (size_t)T * d);
    expert(m, &layer->sw1, &layer->sw2, &layer->sw3, T, NULL, ws);
    for (int t = 0; t < T; t++) {
        float *a = ws->acc + (int64_t)t * d;
        const float *y = ws->ey + (int64_t)t * d;
        float *out = ws->sub + (int64_t)t * d;
        for (int k = 0; k < d; k++) out[k] = num_bf16_1(m->mode, a[k] + y[k]);
    }
}
