/* Uploading a loaded model to the GPU. The CPU side (src/model/model.c) has already validated the checkpoint
 * and bound every tensor; this walks the same bindings and copies each tensor once, in its stored format.
 * It walks twice: first counting bytes (so that a model that does not fit is refused with the numbers before
 * anything is allocated), then copying. */
#ifdef DSV4_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cu_runtime.h"
#include "backend/cuda/cuda_model.h"
#include "model/inventory.h"
#include "util/error.h"
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    struct cuda_model *cm;
    int counting;          /* 1: only add up bytes */
    uint64_t bytes;
    int failed;            /* an allocation or copy failed */
} uploader;

static int track(struct cuda_model *cm, void *p) {
    if (cm->n_allocs == cm->cap_allocs) {
        int nc = cm->cap_allocs ? 2 * cm->cap_allocs : 256;
        void **na = realloc(cm->allocs, sizeof(void *) * (size_t)nc);
        if (!na) return -1;
        cm->allocs = na;
        cm->cap_allocs = nc;
    }
    cm->allocs[cm->n_allocs++] = p;
    return 0;
}

static void *up(uploader *u, const void *src, size_t n) {
    if (!src || !n) return NULL;
    u->bytes += (n + 255) & ~(size_t)255;   /* cudaMalloc granularity */
    if (u->counting || u->failed) return NULL;
    void *d = cu_malloc(n);
    if (!d || cu_upload(d, src, n) || track(u->cm, d)) {
        cu_free(d);
        u->failed = 1;
        return NULL;
    }
    return d;
}

static size_t scale_bytes(const dsv4_weight *w) {
    if (w->fmt == WF_FP8) return (size_t)((w->rows + 127) / 128) * (size_t)w->scale_cols;
    if (w->fmt == WF_FP4) return (size_t)w->rows * (size_t)w->scale_cols;
    return 0;
}

static dsv4_weight up_weight(uploader *u, const dsv4_weight *w) {
    dsv4_weight d = *w;
    d.data = up(u, w->data, (size_t)weight_bytes(w));
    d.scale = up(u, w->scale, scale_bytes(w));
    return d;
}

static float *up_vec(uploader *u, const float *v, int64_t n) { return up(u, v, sizeof(float) * (size_t)n); }

static cu_hc up_hc(uploader *u, const dsv4_hc_weights *h, int nmix, int nscale) {
    cu_hc d = { up_weight(u, &h->fn), up_vec(u, h->base, nmix), up_vec(u, h->scale, nscale) };
    return d;
}

static cu_comp up_comp(uploader *u, const dsv4_compressor_weights *c) {
    const int cw = (c->overlap ? 2 : 1) * c->width;
    cu_comp d = { up_weight(u, &c->wkv), up_weight(u, &c->wgate), up_vec(u, c->ape, (int64_t)c->ratio * cw),
                  up_vec(u, c->norm, c->width) };
    return d;
}

/* The routed experts of one projection as a device array of E weights (each pointing to its own upload). */
static dsv4_weight *up_experts(uploader *u, const dsv4_weight *w, int E) {
    dsv4_weight *host = calloc((size_t)E, sizeof *host);
    if (!host) { u->failed = 1; return NULL; }
    for (int e = 0; e < E; e++) host[e] = up_weight(u, &w[e]);
    dsv4_weight *d = up(u, host, sizeof *host * (size_t)E);
    free(host);
    return d;
}

static void up_layer(uploader *u, const struct dsv4_model *m, const dsv4_layer *ly, cu_layer *d) {
    const dsv4_config *c = &m->cfg;
    const int nmix = hc_mix_count(c->hc_mult);
    d->ratio = ly->ratio;
    d->hash_routed = ly->hash_routed;
    d->attn_norm = up_vec(u, ly->attn_norm, c->dim);
    d->ffn_norm = up_vec(u, ly->ffn_norm, c->dim);
    d->hc_attn = up_hc(u, &ly->hc_attn, nmix, 3);
    d->hc_ffn = up_hc(u, &ly->hc_ffn, nmix, 3);
    d->wq_a = up_weight(u, &ly->wq_a);
    d->wq_b = up_weight(u, &ly->wq_b);
    d->wkv = up_weight(u, &ly->wkv);
    d->wo_a = up_weight(u, &ly->wo_a);
    d->wo_b = up_weight(u, &ly->wo_b);
    d->q_norm = up_vec(u, ly->q_norm, c->q_lora);
    d->kv_norm = up_vec(u, ly->kv_norm, c->head_dim);
    d->attn_sink = up_vec(u, ly->attn_sink, c->n_heads);
    if (ly->ratio) d->comp = up_comp(u, &ly->comp);
    if (ly->ratio == 4) {
        d->icomp = up_comp(u, &ly->icomp);
        d->idx_wq_b = up_weight(u, &ly->idx_wq_b);
        d->idx_weights_proj = up_weight(u, &ly->idx_weights_proj);
    }
    d->gate = up_weight(u, &ly->gate);
    d->gate_bias = ly->hash_routed ? NULL : up_vec(u, ly->gate_bias, c->n_routed);
    d->tid2eid = ly->hash_routed ? up(u, ly->tid2eid, sizeof(int32_t) * (size_t)c->vocab_size * (size_t)c->n_act) : NULL;
    d->w1 = up_experts(u, ly->w1, c->n_routed);
    d->w2 = up_experts(u, ly->w2, c->n_routed);
    d->w3 = up_experts(u, ly->w3, c->n_routed);
    d->efmt = ly->w1[0].fmt;
    d->sw1 = up_weight(u, &ly->sw1);
    d->sw2 = up_weight(u, &ly->sw2);
    d->sw3 = up_weight(u, &ly->sw3);
}

static void up_model(uploader *u, const struct dsv4_model *m) {
    struct cuda_model *cm = u->cm;
    const dsv4_config *c = &m->cfg;
    cm->embed = up_weight(u, &m->embed);
    cm->head = up_weight(u, &m->head);
    cm->norm = up_vec(u, m->norm, c->dim);
    cm->hc_head = up_hc(u, &m->hc_head, c->hc_mult, 1);
    cm->rope_window = up_vec(u, m->rope_window.freq, c->rope_dim / 2);
    cm->rope_compress = up_vec(u, m->rope_compress.freq, c->rope_dim / 2);
    for (int L = 0; L < c->n_layers; L++) up_layer(u, m, &m->layers[L], &cm->layers[L]);
    if (m->mtp) {
        const dsv4_mtp_head *h = m->mtp;
        up_layer(u, m, &h->block, cm->mtp.block);
        cm->mtp.e_proj = up_weight(u, &h->e_proj);
        cm->mtp.h_proj = up_weight(u, &h->h_proj);
        cm->mtp.enorm = up_vec(u, h->enorm, c->dim);
        cm->mtp.hnorm = up_vec(u, h->hnorm, c->dim);
        cm->mtp.norm = up_vec(u, h->norm, c->dim);
        cm->mtp.hc_head = up_hc(u, &h->hc_head, c->hc_mult, 1);
    }
    if (m->dspark) {
        const dsv4_dspark_head *h = m->dspark;
        for (int st = 0; st < h->n_stages; st++) up_layer(u, m, &h->stage[st], &cm->dspark.stages[st]);
        cm->dspark.n_stages = h->n_stages;
        cm->dspark.main_proj = up_weight(u, &h->main_proj);
        cm->dspark.main_norm = up_vec(u, h->main_norm, c->dim);
        cm->dspark.norm = up_vec(u, h->norm, c->dim);
        cm->dspark.hc_head = up_hc(u, &h->hc_head, c->hc_mult, 1);
        cm->dspark.markov_w1 = up_weight(u, &h->markov_w1);
        cm->dspark.markov_w2 = up_weight(u, &h->markov_w2);
        cm->dspark.confidence = up_weight(u, &h->confidence);
    }
}

static void release(struct cuda_model *cm) {
    if (!cm) return;
    cuda_workspace_free(&cm->ws);
    for (int i = 0; i < cm->n_allocs; i++) cu_free(cm->allocs[i]);
    free(cm->allocs);
    free(cm->layers);
    free(cm->mtp.block);
    free(cm->dspark.stages);
    cu_stream_free(cm->st);
    free(cm);
}

int cuda_available(int gpu, dsv4_error *why) { return cu_select(gpu, why) == 0; }

/* Shapes the kernels take (the CPU takes more): say so at load rather than fail in a step. */
static int check_shapes(const dsv4_config *c, dsv4_error *err) {
    if (c->hc_mult > 8) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cuda: hc_mult %d > 8 is not supported", c->hc_mult);
    if (c->index_n_heads && (c->index_head_dim > 256 || c->index_head_dim % 4))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cuda: index_head_dim %d is not supported (a multiple of 4, at most 256)",
                         c->index_head_dim);
    return 0;
}

int cuda_model_init(struct dsv4_model *m, int gpu, dsv4_error *err) {
    int rc = cu_select(gpu, err);
    if (rc) return rc;
    if ((rc = check_shapes(&m->cfg, err))) return rc;
    struct cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm || !(cm->layers = calloc((size_t)m->cfg.n_layers, sizeof(cu_layer))) ||
        (m->mtp && !(cm->mtp.block = calloc(1, sizeof(cu_layer)))) ||
        (m->dspark && !(cm->dspark.stages = calloc((size_t)m->dspark->n_stages, sizeof(cu_layer))))) {
        if (cm) { free(cm->layers); free(cm->mtp.block); }
        free(cm);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    cm->gpu = gpu;
    uploader count = { cm, 1, 0, 0 };
    up_model(&count, m);
    size_t free_b = 0, total_b = 0;
    cu_mem_info(&free_b, &total_b);
    const uint64_t margin = (uint64_t)256 << 20;   /* the step's scratch and the first sequences */
    if (count.bytes + margin > free_b) {
        release(cm);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory: the weights need %.2f GiB (+%.2f GiB working margin), the GPU has "
                         "%.2f GiB free of %.2f GiB", count.bytes / 1073741824.0, margin / 1073741824.0, free_b / 1073741824.0,
                         total_b / 1073741824.0);
    }
    if (!(cm->st = cu_stream_new())) {
        release(cm);
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cuda: cannot create a stream");
    }
    uploader u = { cm, 0, 0, 0 };
    up_model(&u, m);
    if (u.failed) {
        size_t f2 = 0, t2 = 0;
        cu_mem_info(&f2, &t2);
        release(cm);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory uploading the weights (%.2f GiB needed, %.2f GiB were free)",
                         count.bytes / 1073741824.0, free_b / 1073741824.0);
    }
    cm->weight_bytes = u.bytes;
    cm->key_limit = cu_attention_key_limit();
    m->cuda = cm;
    m->state_mem = &seq_mem_cuda;
    if (m->progress) {
        char name[128];
        cu_device_name(name, sizeof name);
        fprintf(stderr, "dsv4: %.2f GiB of weights on GPU %d (%s)\n", u.bytes / 1073741824.0, gpu, name);
    }
    return 0;
}

void cuda_model_free(struct dsv4_model *m) {
    if (!m->cuda) return;
    release(m->cuda);
    m->cuda = NULL;
    m->state_mem = &seq_mem_host;
}
#else
typedef int dsv4_cuda_model_unused; /* built only with CUDA=1 */
#endif
