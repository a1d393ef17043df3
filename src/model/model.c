/* Loading a checkpoint folder into a dsv4_model: config, mmap, validation against the inventory, binding. */
#include "model/model.h"
#include "core/moe_experts.h"
#include "model/fp4_planes.h"
#include "model/expert_place.h"
#include "model/expert_profile.h"
#include "state/kvrows.h"
#include "state/statemem.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cpu/cpufeat.h"
#include "backend/cpu/isa.h"
#include "model/formats.h"
#include "model/synthetic.h"
#include "util/error.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

void dsv4_workspace_free(struct dsv4_workspace *ws); /* core/forward.c */

typedef struct {
    dsv4_model *m;
    dsv4_error *err;
    int rc;
    /* every owned fp32 vector, freed with the model */
    float **owned;
    int n_owned, cap_owned;
} binder;

static float *own_floats(binder *b, size_t n);
static void align_f32(binder *b, dsv4_weight *w);

static const st_tensor *need(binder *b, const char *name) {
    const st_tensor *t = st_find(&b->m->ckpt, name);
    if (!t && !b->rc) b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "missing tensor %s", name);
    return t;
}

/* A matrix: FP8 (+ .scale), I8-packed FP4 (+ .scale), BF16 or F32. The inventory check already validated
 * dtypes and shapes; here we only bind. */
static dsv4_weight bind_weight(binder *b, const char *prefix, const char *suffix) {
    dsv4_weight w = {0};
    char name[192];
    snprintf(name, sizeof name, "%s%s.weight", prefix, suffix);
    const st_tensor *t = need(b, name);
    if (!t) return w;
    w.rows = (int)t->shape[0];
    w.cols = (int)t->shape[1];
    w.data = t->data;
    switch (t->dtype) {
    case ST_F32: w.fmt = WF_F32; break;
    case ST_BF16: w.fmt = WF_BF16; break;
    case ST_F8_E4M3: w.fmt = WF_FP8; w.scale_cols = (w.cols + 127) / 128; break;
    case ST_I8: w.fmt = WF_FP4; w.cols *= 2; w.scale_cols = w.cols / 32; break;
    default:
        if (!b->rc) b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "tensor %s: dtype %s cannot be a matrix", name, st_dtype_name(t->dtype));
        return w;
    }
    align_f32(b, &w);
    if (w.fmt == WF_FP8 || w.fmt == WF_FP4) {
        snprintf(name, sizeof name, "%s%s.scale", prefix, suffix);
        const st_tensor *s = need(b, name);
        if (s) w.scale = s->data;
    }
    return w;
}

/* A matrix given by its full tensor name (no .weight suffix convention, e.g. hc_attn_fn). */
static dsv4_weight bind_f32_matrix(binder *b, const char *name) {
    dsv4_weight w = {0};
    const st_tensor *t = need(b, name);
    if (!t) return w;
    w.fmt = WF_F32;
    w.rows = (int)t->shape[0];
    w.cols = (int)t->shape[1];
    w.data = t->data;
    align_f32(b, &w);
    return w;
}

/* n floats owned by the model (freed with it). */
static float *own_floats(binder *b, size_t n) {
    float *v = malloc(sizeof(float) * (n > 0 ? n : 1));
    if (!v) { if (!b->rc) b->rc = dsv4_fail(b->err, DSV4_E_NOMEM, "out of memory"); return NULL; }
    if (b->n_owned == b->cap_owned) {
        int nc = b->cap_owned ? 2 * b->cap_owned : 256;
        float **no = realloc(b->owned, sizeof *no * (size_t)nc);
        if (!no) { free(v); if (!b->rc) b->rc = dsv4_fail(b->err, DSV4_E_NOMEM, "out of memory"); return NULL; }
        b->owned = no;
        b->cap_owned = nc;
    }
    b->owned[b->n_owned++] = v;
    return v;
}

/* A vector decoded to an owned fp32 array. */
static float *bind_vec(binder *b, const char *name) {
    const st_tensor *t = need(b, name);
    if (!t) return NULL;
    int64_t n = st_numel(t);
    float *v = own_floats(b, (size_t)n);
    if (!v) return NULL;
    for (int64_t i = 0; i < n; i++) {
        if (t->dtype == ST_F32) memcpy(&v[i], (const char *)t->data + 4 * i, 4);
        else { uint16_t h; memcpy(&h, (const char *)t->data + 2 * i, 2); v[i] = bf16_to_f32(h); }
    }
    return v;
}

/* Safetensors packs tensors without alignment; an F32 matrix at an address that is not a multiple of 4 is
 * copied once into owned, aligned memory so every kernel can read it as floats. */
static void align_f32(binder *b, dsv4_weight *w) {
    if (w->fmt != WF_F32 || !w->data || ((uintptr_t)w->data & 3) == 0) return;
    const size_t n = (size_t)w->rows * (size_t)w->cols;
    float *copy = own_floats(b, n);
    if (!copy) return;
    memcpy(copy, w->data, n * sizeof(float));
    w->data = copy;
}

static void bind_hc(binder *b, dsv4_hc_weights *hc, const char *prefix, const char *site) {
    char name[192];
    snprintf(name, sizeof name, "%shc_%s_fn", prefix, site);
    hc->fn = bind_f32_matrix(b, name);
    snprintf(name, sizeof name, "%shc_%s_base", prefix, site);
    hc->base = bind_vec(b, name);
    snprintf(name, sizeof name, "%shc_%s_scale", prefix, site);
    hc->scale = bind_vec(b, name);
}

static void bind_compressor(binder *b, dsv4_compressor_weights *c, const char *prefix, int ratio, int width) {
    char name[192];
    c->ratio = ratio;
    c->overlap = ratio == 4;
    c->width = width;
    c->wkv = bind_weight(b, prefix, "wkv");
    c->wgate = bind_weight(b, prefix, "wgate");
    snprintf(name, sizeof name, "%sape", prefix);
    c->ape = bind_vec(b, name);
    snprintf(name, sizeof name, "%snorm.weight", prefix);
    c->norm = bind_vec(b, name);
}

static int32_t *bind_tid2eid(binder *b, const char *name) {
    const dsv4_config *c = &b->m->cfg;
    const st_tensor *t = need(b, name);
    if (!t) return NULL;
    int64_t n = st_numel(t);
    int32_t *v = malloc(sizeof(int32_t) * (size_t)n);
    if (!v) { if (!b->rc) b->rc = dsv4_fail(b->err, DSV4_E_NOMEM, "out of memory"); return NULL; }
    for (int64_t i = 0; i < n; i++) {
        int64_t e;
        if (t->dtype == ST_I64) memcpy(&e, (const char *)t->data + 8 * i, 8);
        else { int32_t e32; memcpy(&e32, (const char *)t->data + 4 * i, 4); e = e32; }
        if (e < 0 || e >= c->n_routed) {
            free(v);
            if (!b->rc) b->rc = dsv4_fail(b->err, DSV4_E_MODEL, "tensor %s: entry %lld is expert %lld, outside 0..%d",
                                          name, (long long)i, (long long)e, c->n_routed - 1);
            return NULL;
        }
        v[i] = (int32_t)e;
    }
    return v;
}

static void bind_block(binder *b, dsv4_layer *L, const char *p, int ratio, int hash) {
    const dsv4_config *c = &b->m->cfg;
    char q[192], name[192];
    L->ratio = ratio;
    L->hash_routed = hash;
#define VEC(dst, fmt_suffix) do { snprintf(name, sizeof name, "%s" fmt_suffix, p); (dst) = bind_vec(b, name); } while (0)
    VEC(L->attn_norm, "attn_norm.weight");
    VEC(L->ffn_norm, "ffn_norm.weight");
    bind_hc(b, &L->hc_attn, p, "attn");
    bind_hc(b, &L->hc_ffn, p, "ffn");
    snprintf(q, sizeof q, "%sattn.", p);
    L->wq_a = bind_weight(b, q, "wq_a");
    L->wq_b = bind_weight(b, q, "wq_b");
    L->wkv = bind_weight(b, q, "wkv");
    L->wo_a = bind_weight(b, q, "wo_a");
    L->wo_b = bind_weight(b, q, "wo_b");
    VEC(L->q_norm, "attn.q_norm.weight");
    VEC(L->kv_norm, "attn.kv_norm.weight");
    VEC(L->attn_sink, "attn.attn_sink");
    if (ratio) {
        snprintf(q, sizeof q, "%sattn.compressor.", p);
        bind_compressor(b, &L->comp, q, ratio, c->head_dim);
    }
    if (ratio == 4) {
        snprintf(q, sizeof q, "%sattn.indexer.compressor.", p);
        bind_compressor(b, &L->icomp, q, ratio, c->index_head_dim);
        snprintf(q, sizeof q, "%sattn.indexer.", p);
        L->idx_wq_b = bind_weight(b, q, "wq_b");
        L->idx_weights_proj = bind_weight(b, q, "weights_proj");
    }
    snprintf(q, sizeof q, "%sffn.", p);
    L->gate = bind_weight(b, q, "gate");
    if (hash) {
        snprintf(name, sizeof name, "%sffn.gate.tid2eid", p);
        L->tid2eid = bind_tid2eid(b, name);
    } else {
        VEC(L->gate_bias, "ffn.gate.bias");
    }
#undef VEC
    L->w1 = calloc((size_t)c->n_routed, sizeof(dsv4_weight));
    L->w2 = calloc((size_t)c->n_routed, sizeof(dsv4_weight));
    L->w3 = calloc((size_t)c->n_routed, sizeof(dsv4_weight));
    if (!L->w1 || !L->w2 || !L->w3) { if (!b->rc) b->rc = dsv4_fail(b->err, DSV4_E_NOMEM, "out of memory"); return; }
    for (int e = 0; e < c->n_routed && !b->rc; e++) {
        snprintf(q, sizeof q, "%sffn.experts.%d.", p, e);
        L->w1[e] = bind_weight(b, q, "w1");
        L->w2[e] = bind_weight(b, q, "w2");
        L->w3[e] = bind_weight(b, q, "w3");
    }
    snprintf(q, sizeof q, "%sffn.shared_experts.", p);
    L->sw1 = bind_weight(b, q, "w1");
    L->sw2 = bind_weight(b, q, "w2");
    L->sw3 = bind_weight(b, q, "w3");
}

static void free_block_tables(dsv4_layer *L) {
    free(L->w1);
    free(L->w2);
    free(L->w3);
    free(L->tid2eid);
}

/* Which speculative head the checkpoint carries, told by its tensors (spec §2.4): V4 MTP has e_proj, the
 * 0731 DSpark drafter main_proj. A head the config does not describe (num_nextn_predict_layers = 0, or no
 * dspark_* fields) cannot be run and is ignored. */
static dsv4_mtp_kind detect_spec_heads(const dsv4_model *m) {
    if (st_find(&m->ckpt, "mtp.0.e_proj.weight")) return m->cfg.n_mtp >= 1 ? MTP_V4 : MTP_NONE;
    if (st_find(&m->ckpt, "mtp.0.main_proj.weight"))
        return m->cfg.n_mtp >= 1 && m->cfg.n_dspark_targets >= 1 && m->cfg.dspark_markov_rank >= 1 ? MTP_DSPARK : MTP_NONE;
    return MTP_NONE;
}

static int check_spec_heads(dsv4_model *m, dsv4_error *err) {
    m->spec_heads = detect_spec_heads(m);
    if (m->spec_heads == MTP_NONE) return 0;
    dsv4_inventory inv;
    const char *what = m->spec_heads == MTP_V4 ? "V4 MTP" : "DSpark";
    int rc = dsv4_inventory_build(&m->cfg, m->spec_heads, &inv, err);
    if (rc) return dsv4_wrap(err, "speculative head (%s)", what);
    rc = dsv4_inventory_check(&inv, &m->ckpt, err);
    dsv4_inventory_free(&inv);
    if (rc) return dsv4_wrap(err, "speculative head (%s)", what);
    for (int st = 0; m->spec_heads == MTP_DSPARK && st < m->cfg.n_mtp; st++)
        if (m->cfg.compress_ratio[m->cfg.n_layers + st] != 0)
            return dsv4_fail(err, DSV4_E_UNSUPPORTED, "DSpark stage %d has compress ratio %d; only window-only stages "
                             "(ratio 0, as released) are supported", st, m->cfg.compress_ratio[m->cfg.n_layers + st]);
    for (int k = 0; m->spec_heads == MTP_DSPARK && k < m->cfg.n_dspark_targets; k++)
        if (m->cfg.dspark_target_layers[k] < 0 || m->cfg.dspark_target_layers[k] >= m->cfg.n_layers)
            return dsv4_fail(err, DSV4_E_MODEL, "dspark_target_layer_ids[%d] = %d is not a backbone layer", k,
                             m->cfg.dspark_target_layers[k]);
    if (m->spec_heads == MTP_DSPARK && (m->cfg.dspark_block_size < 1 || m->cfg.dspark_block_size > 64 ||
                                        m->cfg.dspark_noise_token < 0 || m->cfg.dspark_noise_token >= m->cfg.vocab_size))
        return dsv4_fail(err, DSV4_E_MODEL, "DSpark: dspark_block_size must be in 1..64 and dspark_noise_token_id a "
                         "vocabulary id");
    if (m->spec_heads == MTP_V4 && m->cfg.compress_ratio[m->cfg.n_layers] != 0)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "the MTP block has compress ratio %d; only window-only MTP blocks "
                         "(ratio 0, as released) are supported", m->cfg.compress_ratio[m->cfg.n_layers]);
    return 0;
}

static void bind_mtp(binder *b, dsv4_model *m) {
    dsv4_mtp_head *h = m->mtp = calloc(1, sizeof *h);
    if (!h) { if (!b->rc) b->rc = dsv4_fail(b->err, DSV4_E_NOMEM, "out of memory"); return; }
    bind_block(b, &h->block, "mtp.0.", 0, 0);
    h->e_proj = bind_weight(b, "mtp.0.", "e_proj");
    h->h_proj = bind_weight(b, "mtp.0.", "h_proj");
    h->enorm = bind_vec(b, "mtp.0.enorm.weight");
    h->hnorm = bind_vec(b, "mtp.0.hnorm.weight");
    h->norm = bind_vec(b, "mtp.0.norm.weight");
    h->hc_head.fn = bind_f32_matrix(b, "mtp.0.hc_head_fn");
    h->hc_head.base = bind_vec(b, "mtp.0.hc_head_base");
    h->hc_head.scale = bind_vec(b, "mtp.0.hc_head_scale");
}

static void bind_dspark(binder *b, dsv4_model *m) {
    const dsv4_config *c = &m->cfg;
    dsv4_dspark_head *h = m->dspark = calloc(1, sizeof *h);
    if (h) h->stage = calloc((size_t)c->n_mtp, sizeof(dsv4_layer));
    if (!h || !h->stage) { if (!b->rc) b->rc = dsv4_fail(b->err, DSV4_E_NOMEM, "out of memory"); return; }
    h->n_stages = c->n_mtp;
    char p[32], name[96];
    for (int s = 0; s < c->n_mtp && !b->rc; s++) {
        snprintf(p, sizeof p, "mtp.%d.", s);
        bind_block(b, &h->stage[s], p, 0, 0);
    }
    h->main_proj = bind_weight(b, "mtp.0.", "main_proj");
    h->main_norm = bind_vec(b, "mtp.0.main_norm.weight");
    snprintf(p, sizeof p, "mtp.%d.", c->n_mtp - 1);
    snprintf(name, sizeof name, "%snorm.weight", p);
    h->norm = bind_vec(b, name);
    snprintf(name, sizeof name, "%shc_head_fn", p);
    h->hc_head.fn = bind_f32_matrix(b, name);
    snprintf(name, sizeof name, "%shc_head_base", p);
    h->hc_head.base = bind_vec(b, name);
    snprintf(name, sizeof name, "%shc_head_scale", p);
    h->hc_head.scale = bind_vec(b, name);
    snprintf(name, sizeof name, "%smarkov_head.", p);
    h->markov_w1 = bind_weight(b, name, "markov_w1");
    h->markov_w2 = bind_weight(b, name, "markov_w2");
    snprintf(name, sizeof name, "%sconfidence_head.", p);
    h->confidence = bind_weight(b, name, "proj");
}

int dsv4_rope_init(dsv4_rope *r, const dsv4_config *cfg, float base, int yarn, dsv4_error *err) {
    const int R = cfg->rope_dim, half = R / 2;
    r->freq = malloc(sizeof(float) * (size_t)half);
    if (!r->freq) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    for (int i = 0; i < half; i++) r->freq[i] = (float)(1.0 / pow((double)base, (double)(2 * i) / (double)R));
    if (yarn) {
        /* YaRN (spec §4.1): pairs below lo keep their frequency, pairs above hi are divided by factor,
         * and the ones between are blended linearly. The range comes from where a pair's wavelength
         * crosses original_seq_len / beta. */
        const double L0 = (double)cfg->original_seq_len, lnb = log((double)base);
        double lo = floor(R * log(L0 / (cfg->beta_fast * 2.0 * M_PI)) / (2.0 * lnb));
        double hi = ceil(R * log(L0 / (cfg->beta_slow * 2.0 * M_PI)) / (2.0 * lnb));
        if (lo < 0) lo = 0;
        if (hi > R - 1) hi = R - 1;
        if (lo == hi) hi += 0.001;
        for (int i = 0; i < half; i++) {
            float ramp = (float)((i - lo) / (hi - lo));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float smooth = 1.0f - ramp;
            /* (freq / factor) (1 - smooth) + freq smooth, the first product fused into the sum */
            r->freq[i] = fmaf(r->freq[i] / cfg->rope_factor, 1.0f - smooth, r->freq[i] * smooth);
        }
    }
    return 0;
}

static uint64_t fingerprint(const dsv4_model *m) {
    XXH64_state_t *st = XXH64_createState();
    if (!st) return 0;
    XXH64_reset(st, 0x647376345f763031ULL);
    XXH64_update(st, &m->cfg, sizeof m->cfg);
    for (int i = 0; i < m->ckpt.n_tensors; i++) {
        const st_tensor *t = &m->ckpt.tensors[i];
        XXH64_update(st, t->name, strlen(t->name) + 1);
        XXH64_update(st, &t->dtype, sizeof t->dtype);
        XXH64_update(st, t->shape, sizeof t->shape);
    }
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

void dsv4_model_free(dsv4_model *m) {
    if (!m) return;
    cuda_model_free(m);
    if (m->layers)
        for (int L = 0; L < m->cfg.n_layers; L++) free_block_tables(&m->layers[L]);
    free(m->layers);
    free(m->route_counts);
    free(m->silu_bf16);
    if (m->mtp) free_block_tables(&m->mtp->block);
    free(m->mtp);
    if (m->dspark) {
        for (int s = 0; s < m->dspark->n_stages && m->dspark->stage; s++) free_block_tables(&m->dspark->stage[s]);
        free(m->dspark->stage);
    }
    free(m->dspark);
    free(m->rope_window.freq);
    free(m->rope_compress.freq);
    dsv4_workspace_free(m->ws);
    if (m->owned) {
        for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
        free(m->owned);
    }
    if (m->pool) dsv4_pool_free(m->pool);
    st_close(&m->ckpt);
    synth_host_free(&m->synth);
    free(m);
}

static int model_cuda_init(dsv4_model *m, const char *dir, const dsv4_load_opts *opts, dsv4_error *err) {
    if (opts->gpu_mem_gb < 0 || opts->gpu_mem_gb > 1e6)
        return dsv4_fail(err, DSV4_E_ARG, "GPU memory budget %g GiB is out of range", opts->gpu_mem_gb);
    const int bus_pct = expert_bus_pct(opts->bus_share);
    if (bus_pct == -1) return dsv4_fail(err, DSV4_E_ARG, "bus share %g is out of range (0 to 1; negative = none)", opts->bus_share);
    const int split_pct = opts->bus_by_token ? expert_split_pct(opts->bus_share) : -1;
    if (opts->bus_by_token && split_pct < 0)
        return dsv4_fail(err, DSV4_E_ARG, "splitting each token's host routes (bus_by_token) needs a bus share above 0, got %g",
                         opts->bus_share);
    expert_profile prof;
    int rc = expert_profile_find(dir, opts->expert_profile, m->cfg.n_layers, m->cfg.n_routed, m->cfg.n_act, &prof, err);
    if (rc) return rc;
    const cuda_placement p = { opts->gpu, opts->n_gpus, (uint64_t)(opts->gpu_mem_gb * 1073741824.0), prof.counts,
                               bus_pct, split_pct };
    rc = cuda_model_init(m, &p, err);
    expert_profile_free(&prof);
    return rc;
}

/* Where a CPU model's weights live (model/safetensors.h, st_memory): by default a copy on huge pages when it fits
 * in memory; a synthetic checkpoint's always (model/synthetic.h synth_host_build). Before binding: the bindings point into wherever the bytes end up. (A CUDA model reads the mapping
 * once, to upload it; its host-resident experts are placed by the CUDA backend.) */
static int place_weights(dsv4_model *m, int n_threads, dsv4_error *err) {
    if (m->cfg.synthetic_holes) {   /* its holes read as zeros: the arena gets every tensor, the holes filled */
        size_t budget;
        int rc = synth_host_budget(&budget, err);
        if (!rc) rc = synth_host_build(&m->ckpt, budget, n_threads, &m->synth, err);
        m->weight_memory = ST_MEM_COPY;
        return rc;
    }
    uint64_t bytes = 0;
    for (int i = 0; i < m->ckpt.n_shards; i++) bytes += m->ckpt.shards[i].len;
    int rc = st_memory_choose(bytes, &m->weight_memory, err);
    if (rc) return rc;
    if (m->weight_memory == ST_MEM_COPY) {
        const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        return st_copy_shards(&m->ckpt, n_threads > 0 ? n_threads : cpus > 0 ? (int)cpus : 1, err);
    }
    for (int i = 0; m->weight_memory == ST_MEM_POPULATE && i < m->ckpt.n_shards; i++)
        st_populate(m->ckpt.shards[i].map, m->ckpt.shards[i].len);
    return 0;
}

/* A CPU model's routed FP4 experts in nibble planes (model/fp4_planes.h) where DSV4_CPU_FP4_PLANES=1 asks for them
 * and the kernels read them (fp4_planes_wanted), repacked in place: only in a private copy of the weights (the file
 * mapping is read-only), after the fingerprint (shapes only) and before any step. The same bits either way. */
static int cpu_fp4_planes(dsv4_model *m, dsv4_error *err) {
    const int want = fp4_planes_wanted(m->dots == CPU_DOTS_PAIRS, dsv4_pool_kernels(m->pool)->name, 0, err);
    if (want < 0) return DSV4_E_ARG;
    /* a synthetic checkpoint's experts past its memory budget share bytes in a cycle: repacking one would repack
     * the others' bytes again */
    const int shared = m->cfg.synthetic_holes && m->synth.expert_own < m->synth.expert_tensors;
    if (!want || m->weight_memory != ST_MEM_COPY || shared) return 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; e < m->cfg.n_routed; e++) {
            dsv4_weight *ws[3] = { &m->layers[l].w1[e], &m->layers[l].w2[e], &m->layers[l].w3[e] };
            for (int k = 0; k < 3; k++)
                if (fp4_planes_fits(ws[k])) (void)fp4_planes_weight(ws[k], (void *)ws[k]->data);
        }
    return 0;
}

int dsv4_model_load(const char *dir, const dsv4_load_opts *opts, dsv4_model **out, dsv4_error *err) {
    dsv4_load_opts def = {0};
    if (!opts) opts = &def;
    *out = NULL;
    if (opts->mode != DSV4_MODE_EXACT && opts->mode != DSV4_MODE_OFFICIAL)
        return dsv4_fail(err, DSV4_E_ARG, "unknown numeric mode %d", (int)opts->mode);
    dsv4_model *m = calloc(1, sizeof *m);
    if (!m) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    int rc = dsv4_config_load(dir, &m->cfg, err);
    if (rc) goto fail;
    m->mode = opts->mode;
    m->state_mem = &seq_mem_host;
    if (m->mode == DSV4_MODE_OFFICIAL && !(m->silu_bf16 = moe_silu_bf16_table())) {
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        goto fail;
    }
    if (opts->cpu_amx && opts->mode == DSV4_MODE_OFFICIAL && opts->device == DSV4_DEVICE_CPU) {
        if (!(cpu_features() & CPU_AMX_BF16)) {
            rc = dsv4_fail(err, DSV4_E_UNSUPPORTED, "cpu_amx: this CPU or kernel has no AMX-BF16 (needs AMX-TILE, AMX-BF16 and Linux 5.16+)");
            goto fail;
        }
        m->dots = CPU_DOTS_AMX;
    } else if (opts->mode == DSV4_MODE_OFFICIAL) {
        /* the pair order (backend/cpu/pairs.h): every CPU linear of a CPU model, the host-resident experts of a
         * CUDA one; DSV4_CPU_PAIRS=0 keeps EXACT's fp32 order, for comparisons */
        const char *e = getenv("DSV4_CPU_PAIRS");
        if (e && strcmp(e, "0") && strcmp(e, "1")) {
            rc = dsv4_fail(err, DSV4_E_ARG, "DSV4_CPU_PAIRS: expected 0 or 1, got '%s'", e);
            goto fail;
        }
        m->dots = e && !strcmp(e, "0") ? CPU_DOTS_F32 : CPU_DOTS_PAIRS;
    }
    if (opts->device != DSV4_DEVICE_CPU && opts->device != DSV4_DEVICE_CUDA) {
        rc = dsv4_fail(err, DSV4_E_ARG, "unknown device %d (cpu = 0, cuda = 1)", opts->device);
        goto fail;
    }
    if (opts->n_gpus < 0 || (opts->n_gpus > 1 && opts->device != DSV4_DEVICE_CUDA)) {
        rc = dsv4_fail(err, DSV4_E_ARG, opts->n_gpus < 0 ? "the number of GPUs must be >= 0, got %d"
                                                         : "%d GPUs: more than one GPU needs the cuda device", opts->n_gpus);
        goto fail;
    }
    if (opts->device == DSV4_DEVICE_CUDA && !cuda_available(opts->gpu, err)) { rc = err ? err->code : DSV4_E_UNSUPPORTED; goto fail; }
    m->max_spec = opts->max_spec > 0 ? opts->max_spec : 16;
    m->ring_len = m->cfg.window + m->max_spec;
    m->kv_format = opts->kv_format;
    if ((rc = kv_format_check(m->kv_format, m->cfg.head_dim, m->cfg.rope_dim, m->cfg.index_head_dim, err))) goto fail;
    if ((rc = st_open_dir(dir, &m->ckpt, err))) goto fail;
    {
        dsv4_inventory inv;
        if ((rc = dsv4_inventory_build(&m->cfg, MTP_NONE, &inv, err))) goto fail;
        rc = dsv4_inventory_check(&inv, &m->ckpt, err);
        dsv4_inventory_free(&inv);
        if (rc) { dsv4_wrap(err, "%s", dir); goto fail; }
    }
    if ((rc = check_spec_heads(m, err))) { dsv4_wrap(err, "%s", dir); goto fail; }
    if (m->mode == DSV4_MODE_OFFICIAL) {
        const dsv4_config *c = &m->cfg;
        if (cfg_nope_dim(c) % 64 || c->index_head_dim % 32 || (c->index_head_dim & (c->index_head_dim - 1))) {
            rc = dsv4_fail(err, DSV4_E_UNSUPPORTED, "OFFICIAL mode needs head_dim - rope dims divisible by 64 and a "
                           "power-of-two index_head_dim divisible by 32 (the official FP8/FP4 simulation blocks)");
            goto fail;
        }
    }
    if (opts->device == DSV4_DEVICE_CPU && (rc = place_weights(m, opts->n_threads, err))) goto fail;
    {
        binder b = { .m = m, .err = err };
        m->embed = bind_weight(&b, "", "embed");
        m->head = bind_weight(&b, "", "head");
        m->norm = bind_vec(&b, "norm.weight");
        m->hc_head.fn = bind_f32_matrix(&b, "hc_head_fn");
        m->hc_head.base = bind_vec(&b, "hc_head_base");
        m->hc_head.scale = bind_vec(&b, "hc_head_scale");
        m->layers = calloc((size_t)m->cfg.n_layers, sizeof(dsv4_layer));
        if (!m->layers && !b.rc) b.rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        for (int L = 0; L < m->cfg.n_layers && !b.rc; L++) {
            char p[32];
            snprintf(p, sizeof p, "layers.%d.", L);
            bind_block(&b, &m->layers[L], p, m->cfg.compress_ratio[L], L < m->cfg.n_hash);
        }
        if (m->spec_heads == MTP_V4 && !b.rc) bind_mtp(&b, m);
        if (m->spec_heads == MTP_DSPARK && !b.rc) bind_dspark(&b, m);
        m->owned = b.owned;
        m->n_owned = b.n_owned;
        if ((rc = b.rc)) goto fail;
    }
    if ((rc = dsv4_rope_init(&m->rope_window, &m->cfg, m->cfg.rope_theta, 0, err))) goto fail;
    if ((rc = dsv4_rope_init(&m->rope_compress, &m->cfg, m->cfg.compress_rope_theta, m->cfg.original_seq_len > 0, err)))
        goto fail;
    m->fingerprint = fingerprint(m);
    const cpu_kernels *kern;
    if ((rc = cpu_kernels_pick(opts->cpu_isa, &kern, err))) goto fail;
    m->pool = dsv4_pool_new(opts->n_threads);
    if (!m->pool) { rc = dsv4_fail(err, DSV4_E_NOMEM, "cannot start worker threads"); goto fail; }
    dsv4_pool_set_kernels(m->pool, kern);
    if (opts->device == DSV4_DEVICE_CPU && (rc = cpu_fp4_planes(m, err))) goto fail;
    /* Progress goes to a terminal only: scripts reading stderr get nothing but errors. */
    m->progress = !opts->quiet && isatty(2);
    if (opts->device == DSV4_DEVICE_CUDA) {
        if ((rc = model_cuda_init(m, dir, opts, err))) goto fail;
        m->device = DSV4_DEVICE_CUDA;
    }
    if (m->progress) {
        uint64_t bytes = 0;
        for (int i = 0; i < m->ckpt.n_shards; i++) bytes += m->ckpt.shards[i].len;
        fprintf(stderr, "dsv4: %s: %d tensors, %.2f GB in %d shard(s) mapped, %d threads\n", dir, m->ckpt.n_tensors,
                bytes / 1e9, m->ckpt.n_shards, dsv4_pool_threads(m->pool));
    }
    *out = m;
    return 0;
fail:
    dsv4_model_free(m);
    return rc;
}

void dsv4_model_get_info(const dsv4_model *m, dsv4_model_info *info) {
    memset(info, 0, sizeof *info);
    info->vocab_size = m->cfg.vocab_size;
    info->dim = m->cfg.dim;
    info->n_layers = m->cfg.n_layers;
    info->n_heads = m->cfg.n_heads;
    info->head_dim = m->cfg.head_dim;
    info->window = m->cfg.window;
    info->max_position = m->cfg.max_position;
    info->bos_id = m->cfg.bos_id;
    info->eos_id = m->cfg.eos_id;
}

int dsv4_device_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "cpu")) return DSV4_DEVICE_CPU;
    if (!strcmp(name, "cuda")) return DSV4_DEVICE_CUDA;
    return -1;
}

int dsv4_cuda_available(dsv4_error *why) { return cuda_available(0, why); }
