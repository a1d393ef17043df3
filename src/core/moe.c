#include "core/moe.h"
#include "core/moe_experts.h"
#include "backend/cpu/kernels.h"
#include "core/numerics.h"
#include "model/expert_place.h"
#include "model/footprint.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* torch's softplus threshold: x above 20 is returned as is. */
static inline float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

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
    linear_bf16_in(m->dots, m->pool, &layer->gate, ws->xn, T, c->dim, ws->router, E);
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

/* xq = xn, FP8-quantized per 128 columns in OFFICIAL mode (what every expert's w1 / w3 multiply). A row's
 * quantization depends on that row alone, so quantizing each token once gives what quantizing its copy for each
 * of its experts gave. */
static void quantize_inputs(dsv4_mode mode, const float *xn, int T, int d, float *xq) {
    memcpy(xq, xn, sizeof(float) * (size_t)T * d);
    if (is_official(mode))
        for (int t = 0; t < T; t++) act_quant_fp8_inplace(xq + (int64_t)t * d, d, 128);
}

/* The tokens routed to expert e, in increasing order: their rows of xq into x [n][d], their routing weights into
 * w, their ids into tok and their pair indices into pair (each when not NULL: the i-th token routed to e is pair
 * first_e + i, as the GPU's plan numbers them). A row naming e twice counts once, with its first slot's weight (the
 * official indexed update keeps one write). With split (a layer's owner row, e an EXPERT_ON_SPLIT expert) only the
 * tokens the token split at pct leaves to the host (model/expert_split.h). Returns n. */
static int gather_pairs(int e, const int32_t *route_e, const float *route_w, int T, int K, const float *xq, int d,
                        const uint8_t *split, int pct, int first_e, float *x, float *w, int32_t *tok, int32_t *pair) {
    int n = 0;
    for (int t = 0, i = 0; t < T; t++)
        for (int j = 0; j < K; j++)
            if (route_e[(int64_t)t * K + j] == e) {
                if (!split || !expert_split_on_bus(split, route_e + (int64_t)t * K, K, e, pct)) {
                    memcpy(x + (int64_t)n * d, xq + (int64_t)t * d, sizeof(float) * d);
                    w[n] = route_w[(int64_t)t * K + j];
                    if (tok) tok[n] = t;
                    if (pair) pair[n] = first_e + i;
                    n++;
                }
                i++;
                break;
            }
    return n;
}

/* The experts of one group, in the order their results are combined: routed experts in increasing id, then (in
 * moe_forward's last group) the shared expert. Their pair rows lie one after the other from row 0 of the pair
 * buffers: `rows` of them are taken. */
typedef struct {
    moe_expert_call call[MOE_GROUP_CALLS + 1];
    int n_calls, rows;
} expert_group;

/* Whether one more expert with `rows` pair rows fits in a group whose pair buffers hold cap rows. */
static int group_fits(const expert_group *g, int rows, int cap) {
    return g->n_calls < MOE_GROUP_CALLS && g->rows + rows <= cap;
}

/* Two pool dispatches for the whole group; expert by expert (three each) when the model asks for it
 * (m->moe_per_expert: the reference the grouped run is tested against, bit for bit). */
static void group_run(struct dsv4_model *m, expert_group *g) {
    if (m->moe_per_expert)
        for (int i = 0; i < g->n_calls; i++) moe_expert_one(m, &g->call[i]);
    else
        moe_experts_grouped(m, g->call, g->n_calls);
}

/* Add the outputs of the group's first n_routed calls to their tokens' sums, call after call (increasing
 * expert id), each call's tokens in increasing order: the order of the one-expert-at-a-time loop. */
static void group_accumulate(dsv4_workspace *ws, const expert_group *g, int n_routed, int d) {
    int row = 0;
    for (int i = 0; i < n_routed; i++)
        for (int r = 0; r < g->call[i].n; r++, row++) {
            float *a = ws->acc + (int64_t)ws->pair_tok[row] * d;
            const float *y = ws->pair_y + (int64_t)row * d;
            for (int k = 0; k < d; k++) a[k] += y[k];
        }
}

void moe_forward(struct dsv4_model *m, const dsv4_layer *layer, dsv4_workspace *ws) {
    const dsv4_config *c = &m->cfg;
    const int T = ws->batch.T, d = c->dim, K = c->n_act, E = c->n_routed, I = c->moe_inter;
    route(m, layer, ws);
    cpu_profile_mark(&m->prof, CP_ROUTE);
    float *xq = ws->ex;
    quantize_inputs(m->mode, ws->xn, T, d, xq);
    memset(ws->acc, 0, sizeof(float) * (size_t)T * d);
    moe_pair_offsets(ws->route_e, T, K, E, ws->moe_first);
    /* experts in increasing id: each token's sum runs in that order however the tokens and experts are grouped */
    expert_group g = { .n_calls = 0, .rows = 0 };
    for (int e = 0; e < E; e++) {
        const int n = ws->moe_first[e + 1] - ws->moe_first[e];
        if (!n) continue;
        if (!group_fits(&g, n, ws->pair_cap)) {
            group_run(m, &g);
            group_accumulate(ws, &g, g.n_calls, d);
            g.n_calls = g.rows = 0;
        }
        const int64_t r = g.rows;
        gather_pairs(e, ws->route_e, ws->route_w, T, K, xq, d, NULL, 0, 0, ws->pair_x + r * d, ws->pair_w + r, ws->pair_tok + r,
                     NULL);
        g.call[g.n_calls++] = (moe_expert_call){ &layer->w1[e], &layer->w2[e], &layer->w3[e], n, ws->pair_x + r * d,
                                                 ws->pair_w + r, ws->pair_g + r * I, ws->pair_v + r * I, ws->pair_y + r * d };
        g.rows += n;
        m->routed_bytes += dsv4_expert_weight_bytes(layer, e);
    }
    /* the shared expert rides in the last group (its rows are the workspace's [T] buffers, not pair rows) */
    g.call[g.n_calls++] = (moe_expert_call){ &layer->sw1, &layer->sw2, &layer->sw3, T, xq, NULL, ws->eg, ws->ev, ws->ey };
    group_run(m, &g);
    group_accumulate(ws, &g, g.n_calls - 1, d);
    for (int t = 0; t < T; t++) {
        float *a = ws->acc + (int64_t)t * d;
        const float *y = ws->ey + (int64_t)t * d;
        float *out = ws->sub + (int64_t)t * d;
        for (int k = 0; k < d; k++) out[k] = num_bf16_1(m->mode, a[k] + y[k]);
    }
    cpu_profile_mark(&m->prof, CP_EXPERTS);
}

int moe_pair_offsets(const int32_t *route_e, int T, int K, int E, int32_t *first) {
    memset(first, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int64_t i = 0; i < (int64_t)T * K; i++)
        if (moe_first_slot(route_e + i / K * K, (int)(i % K))) first[route_e[i] + 1]++;
    for (int e = 0; e < E; e++) first[e + 1] += first[e];
    return first[E];
}

int moe_host_rows(struct dsv4_model *m, const dsv4_layer *layer, const uint8_t *owner, int split_pct, const float *xn,
                  const int32_t *route_e, const float *route_w, int T, moe_host_scratch *scr, float *rows, int32_t *pair) {
    const dsv4_config *c = &m->cfg;
    const int d = c->dim, K = c->n_act, E = c->n_routed, I = c->moe_inter;
    quantize_inputs(m->mode, xn, T, d, scr->xq);
    moe_pair_offsets(route_e, T, K, E, scr->first);
    expert_group g = { .n_calls = 0, .rows = 0 };
    int n_rows = 0;
    for (int e = 0; e < E; e++) {
        int n = scr->first[e + 1] - scr->first[e];
        if ((owner[e] != EXPERT_ON_HOST && owner[e] != EXPERT_ON_SPLIT) || !n) continue;
        if (!group_fits(&g, n, scr->pair_cap)) {
            group_run(m, &g);
            g.n_calls = g.rows = 0;
        }
        const int64_t r = g.rows;
        n = gather_pairs(e, route_e, route_w, T, K, scr->xq, d, owner[e] == EXPERT_ON_SPLIT ? owner : NULL, split_pct, scr->first[e],
                         scr->x + r * d, scr->w + r, NULL, pair + n_rows);
        if (!n) continue;   /* a split expert whose pairs all go over the bus */
        g.call[g.n_calls++] = (moe_expert_call){ &layer->w1[e], &layer->w2[e], &layer->w3[e], n, scr->x + r * d,
                                                 scr->w + r, scr->g + r * I, scr->v + r * I, rows + (int64_t)n_rows * d };
        g.rows += n;
        n_rows += n;
        m->routed_bytes += dsv4_expert_weight_bytes(layer, e);
    }
    if (g.n_calls) group_run(m, &g);
    return n_rows;
}

int moe_host_scratch_init(moe_host_scratch *scr, const dsv4_config *c, int T) {
    memset(scr, 0, sizeof *scr);
    const int cap = moe_pair_cap(T, c->n_act);
    scr->xq = malloc(sizeof(float) * (size_t)T * c->dim);
    scr->x = malloc(sizeof(float) * (size_t)cap * c->dim);
    scr->g = malloc(sizeof(float) * (size_t)cap * c->moe_inter);
    scr->v = malloc(sizeof(float) * (size_t)cap * c->moe_inter);
    scr->w = malloc(sizeof(float) * (size_t)cap);
    scr->first = malloc(sizeof(int32_t) * (size_t)(c->n_routed + 1));
    scr->T_cap = T;
    scr->pair_cap = cap;
    if (scr->xq && scr->x && scr->g && scr->v && scr->w && scr->first) return 0;
    moe_host_scratch_free(scr);
    return -1;
}

void moe_host_scratch_free(moe_host_scratch *scr) {
    free(scr->xq);
    free(scr->x);
    free(scr->g);
    free(scr->v);
    free(scr->w);
    free(scr->first);
    memset(scr, 0, sizeof *scr);
}
