#include "model/inventory.h"
#include "util/error.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int add(dsv4_inventory *inv, st_dtype dt, st_dtype alt, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int add(dsv4_inventory *inv, st_dtype dt, st_dtype alt, int64_t d0, int64_t d1, const char *fmt, ...) {
    if (inv->n == inv->cap) {
        int nc = inv->cap ? inv->cap * 2 : 256;
        dsv4_tensor_spec *nv = realloc(inv->v, sizeof *nv * (size_t)nc);
        if (!nv) return -1;
        inv->v = nv;
        inv->cap = nc;
    }
    dsv4_tensor_spec *s = &inv->v[inv->n++];
    memset(s, 0, sizeof *s);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    s->dtype = dt;
    s->alt = alt;
    s->ndim = d1 < 0 ? 1 : 2;
    s->shape[0] = d0;
    s->shape[1] = d1 < 0 ? 0 : d1;
    return 0;
}

#define ADD(...) do { if (add(inv, __VA_ARGS__)) goto oom; } while (0)
#define VEC(dt, alt, n, ...) ADD(dt, alt, n, -1, __VA_ARGS__)

static int fp8_linear(dsv4_inventory *inv, const char *p, int64_t O, int64_t I) {
    if (add(inv, ST_F8_E4M3, ST_F8_E4M3, O, I, "%s.weight", p)) return -1;
    return add(inv, ST_F8_E8M0, ST_F8_E8M0, fp8_scale_dim(O), fp8_scale_dim(I), "%s.scale", p);
}

static int expert_linear(dsv4_inventory *inv, const dsv4_config *c, const char *p, int64_t O, int64_t I) {
    if (!c->expert_fp4) return fp8_linear(inv, p, O, I);
    if (add(inv, ST_I8, ST_I8, O, I / 2, "%s.weight", p)) return -1;
    return add(inv, ST_F8_E8M0, ST_F8_E8M0, O, I / 32, "%s.scale", p);
}

/* One transformer block: backbone layer, MTP block or DSpark stage. */
static int block(dsv4_inventory *inv, const dsv4_config *c, const char *p, int ratio, int hash) {
    const int64_t d = c->dim, H = c->n_heads, D = c->head_dim, hc = c->hc_mult, mix = hc_mix_count(c->hc_mult);
    const int64_t G = c->o_groups, I = c->moe_inter;
    char q[192];
    VEC(ST_BF16, ST_F32, d, "%s.attn_norm.weight", p);
    VEC(ST_BF16, ST_F32, d, "%s.ffn_norm.weight", p);
    const char *site[2] = {"attn", "ffn"};
    for (int s = 0; s < 2; s++) {
        ADD(ST_F32, ST_F32, mix, hc * d, "%s.hc_%s_fn", p, site[s]);
        VEC(ST_F32, ST_F32, mix, "%s.hc_%s_base", p, site[s]);
        VEC(ST_F32, ST_F32, 3, "%s.hc_%s_scale", p, site[s]);
    }
#define LIN(fn, O, In, ...) do { snprintf(q, sizeof q, __VA_ARGS__); if (fn(inv, q, O, In)) goto oom; } while (0)
    LIN(fp8_linear, c->q_lora, d, "%s.attn.wq_a", p);
    VEC(ST_BF16, ST_F32, c->q_lora, "%s.attn.q_norm.weight", p);
    LIN(fp8_linear, H * D, c->q_lora, "%s.attn.wq_b", p);
    LIN(fp8_linear, D, d, "%s.attn.wkv", p);
    VEC(ST_BF16, ST_F32, D, "%s.attn.kv_norm.weight", p);
    LIN(fp8_linear, G * c->o_lora, H * D / G, "%s.attn.wo_a", p); /* the model uses it dequantized (BF16) */
    LIN(fp8_linear, d, G * c->o_lora, "%s.attn.wo_b", p);
    VEC(ST_F32, ST_F32, H, "%s.attn.attn_sink", p);
    if (ratio) {
        int64_t coff = ratio == 4 ? 2 : 1;
        ADD(ST_BF16, ST_F32, coff * D, d, "%s.attn.compressor.wkv.weight", p);
        ADD(ST_BF16, ST_F32, coff * D, d, "%s.attn.compressor.wgate.weight", p);
        ADD(ST_F32, ST_F32, ratio, coff * D, "%s.attn.compressor.ape", p);
        VEC(ST_BF16, ST_F32, D, "%s.attn.compressor.norm.weight", p);
    }
    if (ratio == 4) {
        const int64_t nI = c->index_n_heads, cI = c->index_head_dim;
        LIN(fp8_linear, nI * cI, c->q_lora, "%s.attn.indexer.wq_b", p);
        ADD(ST_BF16, ST_F32, nI, d, "%s.attn.indexer.weights_proj.weight", p);
        ADD(ST_BF16, ST_F32, 2 * cI, d, "%s.attn.indexer.compressor.wkv.weight", p);
        ADD(ST_BF16, ST_F32, 2 * cI, d, "%s.attn.indexer.compressor.wgate.weight", p);
        ADD(ST_F32, ST_F32, 4, 2 * cI, "%s.attn.indexer.compressor.ape", p);
        VEC(ST_BF16, ST_F32, cI, "%s.attn.indexer.compressor.norm.weight", p);
    }
    ADD(ST_BF16, ST_F32, c->n_routed, d, "%s.ffn.gate.weight", p);
    if (hash) ADD(ST_I32, ST_I64, c->vocab_size, c->n_act, "%s.ffn.gate.tid2eid", p);
    else VEC(ST_F32, ST_F32, c->n_routed, "%s.ffn.gate.bias", p);
    for (int e = 0; e < c->n_routed; e++) {
        static const int w_out_is_d[3] = {0, 1, 0};   /* w1: [I,d], w2: [d,I], w3: [I,d] */
        for (int w = 0; w < 3; w++) {
            snprintf(q, sizeof q, "%s.ffn.experts.%d.w%d", p, e, w + 1);
            if (expert_linear(inv, c, q, w_out_is_d[w] ? d : I, w_out_is_d[w] ? I : d)) goto oom;
        }
    }
    LIN(fp8_linear, I, d, "%s.ffn.shared_experts.w1", p);
    LIN(fp8_linear, d, I, "%s.ffn.shared_experts.w2", p);
    LIN(fp8_linear, I, d, "%s.ffn.shared_experts.w3", p);
    return 0;
oom:
    return -1;
}

static int hc_head(dsv4_inventory *inv, const dsv4_config *c, const char *p) {
    const int64_t hc = c->hc_mult;
    ADD(ST_F32, ST_F32, hc, hc * c->dim, "%shc_head_fn", p);
    VEC(ST_F32, ST_F32, hc, "%shc_head_base", p);
    VEC(ST_F32, ST_F32, 1, "%shc_head_scale", p);
    return 0;
oom:
    return -1;
}

int dsv4_inventory_build(const dsv4_config *c, dsv4_mtp_kind mtp, dsv4_inventory *inv, dsv4_error *err) {
    memset(inv, 0, sizeof *inv);
    const int64_t V = c->vocab_size, d = c->dim;
    char p[64];
    ADD(ST_BF16, ST_BF16, V, d, "embed.weight");
    ADD(ST_BF16, ST_F32, V, d, "head.weight");
    VEC(ST_BF16, ST_F32, d, "norm.weight");
    if (hc_head(inv, c, "")) goto oom;
    for (int L = 0; L < c->n_layers; L++) {
        snprintf(p, sizeof p, "layers.%d", L);
        if (block(inv, c, p, c->compress_ratio[L], L < c->n_hash)) goto oom;
    }
    if (mtp == MTP_V4) {
        if (c->n_mtp < 1) {
            dsv4_inventory_free(inv);
            return dsv4_fail(err, DSV4_E_MODEL, "config has no MTP layer (num_nextn_predict_layers = 0)");
        }
        if (block(inv, c, "mtp.0", c->compress_ratio[c->n_layers], 0)) goto oom;
        if (fp8_linear(inv, "mtp.0.e_proj", d, d) || fp8_linear(inv, "mtp.0.h_proj", d, d)) goto oom;
        VEC(ST_BF16, ST_F32, d, "mtp.0.enorm.weight");
        VEC(ST_BF16, ST_F32, d, "mtp.0.hnorm.weight");
        VEC(ST_BF16, ST_F32, d, "mtp.0.norm.weight");
        if (hc_head(inv, c, "mtp.0.")) goto oom;
    } else if (mtp == MTP_DSPARK) {
        const int S = c->n_mtp, r = c->dspark_markov_rank;
        if (S < 1 || c->n_dspark_targets < 1 || r < 1) {
            dsv4_inventory_free(inv);
            return dsv4_fail(err, DSV4_E_MODEL, "config has no DSpark drafter (dspark_* fields missing)");
        }
        for (int s = 0; s < S; s++) {
            snprintf(p, sizeof p, "mtp.%d", s);
            if (block(inv, c, p, c->compress_ratio[c->n_layers + s], 0)) goto oom;
        }
        if (fp8_linear(inv, "mtp.0.main_proj", d, (int64_t)c->n_dspark_targets * d)) goto oom;
        VEC(ST_BF16, ST_F32, d, "mtp.0.main_norm.weight");
        snprintf(p, sizeof p, "mtp.%d.", S - 1);
        VEC(ST_BF16, ST_F32, d, "%snorm.weight", p);
        if (hc_head(inv, c, p)) goto oom;
        ADD(ST_BF16, ST_BF16, V, r, "%smarkov_head.markov_w1.weight", p);
        ADD(ST_BF16, ST_F32, V, r, "%smarkov_head.markov_w2.weight", p);
        ADD(ST_BF16, ST_F32, 1, d + r, "%sconfidence_head.proj.weight", p);
    }
    return 0;
oom:
    dsv4_inventory_free(inv);
    return dsv4_fail(err, DSV4_E_NOMEM, "out of memory building the tensor inventory");
}

void dsv4_inventory_free(dsv4_inventory *inv) {
    free(inv->v);
    memset(inv, 0, sizeof *inv);
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

int dsv4_inventory_check(const dsv4_inventory *inv, const st_archive *a, dsv4_error *err) {
    for (int i = 0; i < inv->n; i++) {
        const dsv4_tensor_spec *s = &inv->v[i];
        const st_tensor *t = st_find(a, s->name);
        if (!t) return dsv4_fail(err, DSV4_E_MODEL, "missing tensor %s", s->name);
        if (t->dtype != s->dtype && t->dtype != s->alt)
            return dsv4_fail(err, DSV4_E_MODEL, "tensor %s has dtype %s, expected %s%s%s", s->name,
                             st_dtype_name(t->dtype), st_dtype_name(s->dtype), s->alt != s->dtype ? " or " : "",
                             s->alt != s->dtype ? st_dtype_name(s->alt) : "");
        int same = t->ndim == s->ndim;
        for (int k = 0; same && k < s->ndim; k++) same = t->shape[k] == s->shape[k];
        if (!same) {
            char got[96], want[96];
            shape_str(got, sizeof got, t->ndim, t->shape);
            shape_str(want, sizeof want, s->ndim, s->shape);
            return dsv4_fail(err, DSV4_E_MODEL, "tensor %s has shape %s, expected %s", s->name, got, want);
        }
    }
    return 0;
}
