#include "model/footprint.h"

static uint64_t wbytes(const dsv4_weight *w) {
    if (!w->data) return 0;
    return weight_bytes(w) + weight_scale_bytes(w);
}

/* Elements of a weight a token multiplies by: each once (a grouped linear's groups take disjoint rows). */
static uint64_t welems(const dsv4_weight *w) { return w->data ? (uint64_t)w->rows * (uint64_t)w->cols : 0; }

/* Every weight of a layer but its routed experts (each a linear that every token of a step passes through),
 * summed by `of` (bytes or elements). */
static uint64_t layer_fixed(const dsv4_layer *L, uint64_t (*of)(const dsv4_weight *)) {
    const dsv4_weight *ws[] = {&L->hc_attn.fn, &L->hc_ffn.fn, &L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b,
                               &L->comp.wkv, &L->comp.wgate, &L->icomp.wkv, &L->icomp.wgate, &L->idx_wq_b,
                               &L->idx_weights_proj, &L->gate, &L->sw1, &L->sw2, &L->sw3};
    uint64_t b = 0;
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) b += of(ws[i]);
    return b;
}

static uint64_t layer_fixed_bytes(const dsv4_layer *L) { return layer_fixed(L, wbytes); }

static uint64_t expert_bytes(const dsv4_layer *L, int e) {
    return wbytes(&L->w1[e]) + wbytes(&L->w2[e]) + wbytes(&L->w3[e]);
}

uint64_t dsv4_fixed_weight_bytes(const struct dsv4_model *m) {
    uint64_t b = wbytes(&m->head) + wbytes(&m->hc_head.fn) + weight_bytes(&m->embed) / (uint64_t)m->cfg.vocab_size;
    for (int l = 0; l < m->cfg.n_layers; l++) b += layer_fixed_bytes(&m->layers[l]);
    return b;
}

uint64_t dsv4_expert_weight_bytes(const dsv4_layer *L, int e) { return expert_bytes(L, e); }

uint64_t dsv4_decode_weight_bytes(const struct dsv4_model *m) {
    uint64_t b = dsv4_fixed_weight_bytes(m);
    for (int l = 0; l < m->cfg.n_layers; l++) b += (uint64_t)m->cfg.n_act * expert_bytes(&m->layers[l], 0);
    return b;
}

uint64_t dsv4_total_weight_bytes(const struct dsv4_model *m) {
    uint64_t b = wbytes(&m->head) + wbytes(&m->hc_head.fn) + weight_bytes(&m->embed);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        b += layer_fixed_bytes(&m->layers[l]);
        for (int e = 0; e < m->cfg.n_routed; e++) b += expert_bytes(&m->layers[l], e);
    }
    return b;
}

uint64_t dsv4_token_linear_flops(const struct dsv4_model *m) {
    uint64_t e = welems(&m->head) + welems(&m->hc_head.fn);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const dsv4_layer *L = &m->layers[l];
        e += layer_fixed(L, welems) + (uint64_t)m->cfg.n_act * (welems(&L->w1[0]) + welems(&L->w2[0]) + welems(&L->w3[0]));
    }
    return 2 * e;
}
