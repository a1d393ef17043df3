/* Uploading a loaded model to the GPU. The CPU side (src/model/model.c) has already validated the checkpoint
 * and bound every tensor; this walks the same bindings and copies each tensor once, in its stored format.
 * It walks twice: first counting bytes (so that a model that does not fit is refused with the numbers before
 * anything is allocated), then copying. */
#ifdef DSV4_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cu_runtime.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cuda_ep.h"
#include "backend/cuda/cuda_host_experts.h"
#include "backend/cuda/cu_graph.h"
#include "backend/cuda/cu_mma.h"
#include "backend/cuda/cu_mma_gemm.h"
#include "backend/cpu/pool.h"
#include "model/expert_place.h"
#include "model/footprint.h"
#include "model/synthetic.h"
#include "model/inventory.h"
#include "util/error.h"
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    struct cuda_model *cm;
    int rank, n_ranks;     /* which routed experts of the main layers to upload (expert_place.h) */
    int synthetic;         /* the checkpoint's big matrices are holes: fill them on the GPU (model/synthetic.h) */
    int distinct;          /* main layers with weights of their own; later ones share an earlier layer's (synthetic) */
    int counting;          /* 1: only add up bytes */
    const expert_map *host;/* routed experts of the main layers that stay in host memory (owner NULL: none) */
    int pack_fp4;          /* FP4 routed experts of whole 128-column chunks packed: cuda_model.pack_fp4 */
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

/* n bytes of random values of a kind (synthetic checkpoints), or of one byte value (kind 0). */
static void *synth(uploader *u, size_t n, int kind, int byte) {
    if (!n) return NULL;
    u->bytes += (n + 255) & ~(size_t)255;
    if (u->counting || u->failed) return NULL;
    void *d = cu_malloc(n);
    if (!d || track(u->cm, d)) {
        cu_free(d);
        u->failed = 1;
        return NULL;
    }
    if (kind) cu_fill_synth(d, n, kind, 0x5eed0000ULL + (uint64_t)u->cm->n_allocs);
    else if (cu_fill_bytes(d, byte, n)) u->failed = 1;
    return d;
}

static dsv4_weight up_weight(uploader *u, const dsv4_weight *w) {
    dsv4_weight d = *w;
    if (u->synthetic && synthetic_hole_weight(w->fmt, (size_t)weight_bytes(w))) {
        const int kind = w->fmt == WF_FP8 ? CU_SYNTH_FP8 : w->fmt == WF_FP4 ? CU_SYNTH_FP4 : CU_SYNTH_BF16;
        d.data = synth(u, (size_t)weight_bytes(w), kind, 0);
        d.scale = synth(u, (size_t)weight_scale_bytes(w), 0, SYNTH_SCALE_BYTE);
        return d;
    }
    d.data = up(u, w->data, (size_t)weight_bytes(w));
    d.scale = up(u, w->scale, (size_t)weight_scale_bytes(w));
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

/* The routed experts of one projection as a device array of E weights (each pointing to its own upload). With
 * `partitioned`, only the experts of the uploader's rank; experts with on_host[e] set stay in host memory
 * (cuda_host_experts.h). Those not uploaded keep data NULL. pack: 0 as they are, 1 cu_fp4_frag_pack, 2
 * cu_fp4_nat_pack (cuda_model.pack_fp4). */
static dsv4_weight *up_experts(uploader *u, const dsv4_weight *w, int E, int partitioned, const uint8_t *on_host, int main_L, int pack) {
    dsv4_weight *host = calloc((size_t)E + 1, sizeof *host);   /* entry E: absent (data NULL), cu_moe_split_tiles */
    if (!host) { u->failed = 1; return NULL; }
    for (int e = 0; e < E; e++) {
        host[e] = w[e];
        host[e].data = NULL;
        host[e].scale = NULL;
        const int owner = on_host ? on_host[e] : EXPERT_ON_GPU;
        if (owner == EXPERT_ON_HOST) continue;
        int own = 1;   /* bytes of its own to pack */
        if (owner == EXPERT_ON_BUS || owner == EXPERT_ON_SPLIT) {
            /* in the bus arena, page-locked and mapped: the kernels read it by the host pointer, over PCIe */
            host[e] = w[e];
            own = !u->counting && cuda_hx_bus_owns(u->cm->hx, main_L, e);
        } else if (!partitioned || expert_owner(E, u->n_ranks, e) == u->rank) {
            host[e] = up_weight(u, &w[e]);
        }
        dsv4_error perr;
        if (pack && own && host[e].data && !u->failed && !u->counting &&
            (pack == 2 ? cu_fp4_nat_pack : cu_fp4_frag_pack)(NULL, (void *)host[e].data, host[e].rows, host[e].cols, &perr))
            u->failed = 1;
    }
    dsv4_weight *d = up(u, host, sizeof *host * ((size_t)E + 1));
    free(host);
    return d;
}

/* main_L: the main layer's index, or -1 (MTP / DSpark blocks keep every expert on the GPU) */
static cu_layer_experts up_layer_experts(uploader *u, const struct dsv4_model *m, const dsv4_layer *ly, int partitioned, int main_L) {
    const int E = m->cfg.n_routed;
    const uint8_t *on_host = main_L >= 0 && u->host && u->host->owner ? u->host->owner + (int64_t)main_L * E : NULL;
    /* packed (DSV4_CUDA_EXPERT_PACK, DSV4_CUDA_NATIVE_EXPERTS): every reader is a tensor-core kernel that knows the
     * layout (cu_mma.h) */
    const int pack = ly->w1[0].fmt == WF_FP4 && m->cfg.dim % 128 == 0 && m->cfg.moe_inter % 128 == 0 ? u->pack_fp4 : 0;
    cu_layer_experts x = { up_experts(u, ly->w1, E, partitioned, on_host, main_L, pack),
                           up_experts(u, ly->w2, E, partitioned, on_host, main_L, pack),
                           up_experts(u, ly->w3, E, partitioned, on_host, main_L, pack),
                           pack == 2 ? CU_FMT_FP4_NAT : pack ? CU_FMT_FP4_FRAG : ly->w1[0].fmt };
    return x;
}

/* partitioned: a main layer of a model spread over several GPUs (its routed experts by expert_place.h); main_L:
 * the main layer's index, or -1 */
static void up_layer(uploader *u, const struct dsv4_model *m, const dsv4_layer *ly, cu_layer *d, int partitioned, int main_L) {
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
    d->ep = partitioned;
    d->ex = up_layer_experts(u, m, ly, partitioned, main_L);
    d->sw1 = up_weight(u, &ly->sw1);
    d->sw2 = up_weight(u, &ly->sw2);
    d->sw3 = up_weight(u, &ly->sw3);
}

/* A synthetic model bigger than the GPU: main layer L >= distinct runs on the weights of the last earlier layer of
 * its kind (same compression ratio, same routing), so every layer still reads gigabytes that are not in the L2. */
static int shared_source(const struct dsv4_model *m, int distinct, int L) {
    for (int l = distinct - 1; l >= 0; l--)
        if (m->layers[l].ratio == m->layers[L].ratio && m->layers[l].hash_routed == m->layers[L].hash_routed) return l;
    return -1;
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
    for (int L = 0; L < c->n_layers; L++) {
        if (L >= u->distinct) cm->layers[L] = cm->layers[shared_source(m, u->distinct, L)];
        else up_layer(u, m, &m->layers[L], &cm->layers[L], u->n_ranks > 1, L);
    }
    if (m->mtp) {
        const dsv4_mtp_head *h = m->mtp;
        up_layer(u, m, &h->block, cm->mtp.block, 0, -1);
        cm->mtp.e_proj = up_weight(u, &h->e_proj);
        cm->mtp.h_proj = up_weight(u, &h->h_proj);
        cm->mtp.enorm = up_vec(u, h->enorm, c->dim);
        cm->mtp.hnorm = up_vec(u, h->hnorm, c->dim);
        cm->mtp.norm = up_vec(u, h->norm, c->dim);
        cm->mtp.hc_head = up_hc(u, &h->hc_head, c->hc_mult, 1);
    }
    if (m->dspark) {
        const dsv4_dspark_head *h = m->dspark;
        for (int st = 0; st < h->n_stages; st++) up_layer(u, m, &h->stage[st], &cm->dspark.stages[st], 0, -1);
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

/* Rank r >= 1 of a model spread over several GPUs: the routed experts of the main layers it holds. */
static void up_rank(uploader *u, const struct dsv4_model *m) {
    for (int L = 0; L < m->cfg.n_layers; L++)
        u->cm->layers[L].ex = L >= u->distinct ? u->cm->layers[shared_source(m, u->distinct, L)].ex
                                               : up_layer_experts(u, m, &m->layers[L], 1, L);
}

static void release(struct cuda_model *cm) {
    if (!cm) return;
    cu_use(cm->gpu);
    if (cm->ep) {
        cu_ep *ep = cm->ep;
        cuda_ep_free_scratch(ep);
        cu_comm_close(ep->comm);
        for (int r = 1; r < ep->n; r++) release(ep->rank[r].cm);
        cu_use(cm->gpu);
        free(ep->rank);
        free(ep->weight_bytes);
        free(ep);
    }
    cu_graphs_free(cm->graphs);
    cu_event_free(cm->fork_ev);
    cu_event_free(cm->join_ev);
    cu_stream_free(cm->side);
    cuda_workspace_free(&cm->ws);
    if (cm->hx) {
        cuda_hx_free(cm->hx);
        free(cm->hx);
    }
    cu_free(cm->route_counts);
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
    if (c->n_act > 16) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cuda: %d experts per token > 16 is not supported", c->n_act);
    if (c->index_n_heads && (c->index_head_dim > 256 || c->index_head_dim % 4))
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cuda: index_head_dim %d is not supported (a multiple of 4, at most 256)",
                         c->index_head_dim);
    return 0;
}

static struct cuda_model *new_cuda_model(const struct dsv4_model *m, int gpu, int with_heads) {
    struct cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm) return NULL;
    cm->gpu = gpu;
    cm->distinct = m->cfg.n_layers;
    if (!(cm->layers = calloc((size_t)m->cfg.n_layers, sizeof(cu_layer))) ||
        (with_heads && m->mtp && !(cm->mtp.block = calloc(1, sizeof(cu_layer)))) ||
        (with_heads && m->dspark && !(cm->dspark.stages = calloc((size_t)m->dspark->n_stages, sizeof(cu_layer))))) {
        free(cm->layers);
        free(cm->mtp.block);
        free(cm);
        return NULL;
    }
    return cm;
}

/* GPU memory kept free beside the weights: the step's scratch and the first sequences */
#define CU_WORK_MARGIN ((uint64_t)256 << 20)

/* Count what rank `rank` of n_ranks needs (walk(u, m) with counting on) and refuse, with the numbers, what does
 * not fit on its GPU (current device). */
static int check_fit(struct cuda_model *cm, const struct dsv4_model *m, int rank, int n_ranks, void (*walk)(uploader *, const struct dsv4_model *),
                     uint64_t *need, dsv4_error *err) {
    uploader count = { .cm = cm, .rank = rank, .n_ranks = n_ranks, .synthetic = m->cfg.synthetic_holes, .distinct = cm->distinct,
                       .counting = 1, .host = cm->hx ? &cm->hx->map : NULL, .pack_fp4 = cm->pack_fp4 };
    walk(&count, m);
    size_t free_b = 0, total_b = 0;
    cu_mem_info(&free_b, &total_b);
    const uint64_t margin = CU_WORK_MARGIN;
    *need = count.bytes;
    if (count.bytes + margin <= free_b) return 0;
    return dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory on GPU %d%s: the weights need %.2f GiB (+%.2f GiB working margin), the GPU "
                     "has %.2f GiB free of %.2f GiB", cm->gpu, n_ranks > 1 ? (rank ? " (an expert rank)" : " (rank 0)") : "",
                     count.bytes / 1073741824.0, margin / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0);
}

static int upload(struct cuda_model *cm, const struct dsv4_model *m, int rank, int n_ranks, void (*walk)(uploader *, const struct dsv4_model *),
                  uint64_t need, dsv4_error *err) {
    if (!(cm->st = cu_stream_new())) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cuda: cannot create a stream on GPU %d", cm->gpu);
    uploader u = { .cm = cm, .rank = rank, .n_ranks = n_ranks, .synthetic = m->cfg.synthetic_holes, .distinct = cm->distinct,
                   .host = cm->hx ? &cm->hx->map : NULL, .pack_fp4 = cm->pack_fp4 };
    walk(&u, m);
    if (!u.failed && (u.synthetic || u.pack_fp4) && cu_sync()) u.failed = 1;   /* the fills and packs ran on the default stream */
    if (u.failed) {
        size_t f = 0, t = 0;
        cu_mem_info(&f, &t);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory on GPU %d uploading the weights (%.2f GiB needed, %.2f GiB free now)",
                         cm->gpu, need / 1073741824.0, f / 1073741824.0);
    }
    cm->weight_bytes = u.bytes;
    return 0;
}

#define CU_MAX_GPUS 16

/* When the weights need more than the budget (p->gpu_mem, or what is free less the working margin), keep in host
 * memory the routed experts model/expert_place.h chooses (issue 15). */
static int place_experts(struct cuda_model *cm, struct dsv4_model *m, const cuda_placement *p, dsv4_error *err) {
    if (m->cfg.synthetic_holes && !p->gpu_mem) return 0;   /* a synthetic model shares layers instead (choose_distinct) */
    size_t fb = 0, tb = 0;
    cu_mem_info(&fb, &tb);
    const uint64_t budget = p->gpu_mem ? p->gpu_mem : (fb > CU_WORK_MARGIN ? fb - CU_WORK_MARGIN : 0);
    expert_map map;
    uint64_t fixed, one;
    int rc = expert_map_for_budget(m, budget, p->profile, &map, &fixed, &one, err);
    if (rc) return dsv4_wrap(err, "GPU %d (%.2f GiB free of %.2f GiB%s)", cm->gpu, fb / 1073741824.0, tb / 1073741824.0,
                             p->gpu_mem ? ", --gpu-mem" : "");
    if (!map.owner) return 0;
    int bus_pct = 0;
    if (p->split_pct < 0)
        bus_pct = expert_map_split_bus(&map, p->bus_pct, m->cfg.n_act, p->profile, expert_bus_room(one));
    else if (expert_map_split_tokens(&map, p->split_pct, expert_bus_room(one))) {
        const int64_t n = map.n_host;
        expert_map_free(&map);
        return dsv4_fail(err, DSV4_E_NOMEM, "--bus-by-token page-locks every expert in host memory, and %lld of them (%.2f GiB) "
                         "are more than 60 %% of this machine's memory: a larger --gpu-mem, or --bus-share without "
                         "--bus-by-token, needs less", (long long)n, (double)n * (double)one / 1073741824.0);
    } else
        cm->pack_fp4 = 0;   /* the host reads split experts' bytes too: they keep the checkpoint's layout */
    if (p->n_gpus > 1) {
        expert_map_free(&map);
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "routed experts in host memory together with --gpus are not supported yet "
                         "(%lld of %lld would stay on the host)", (long long)map.n_host, (long long)m->cfg.n_layers * m->cfg.n_routed);
    }
    if (!(cm->hx = calloc(1, sizeof *cm->hx))) {
        expert_map_free(&map);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    rc = cuda_hx_init(cm->hx, &map, err);
    if (!rc) cm->hx->bus_pct = bus_pct;
    /* a synthetic checkpoint: its host experts get real bytes in host memory (their bindings are holes) */
    if (!rc && m->cfg.synthetic_holes) rc = cuda_hx_fill_synthetic(cm->hx, m, err);
    else if (!rc) rc = cuda_hx_place(cm->hx, m, err);
    return rc;
}

/* A synthetic checkpoint (model/synthetic.h) may be bigger than its GPUs: keep the first `distinct` main layers'
 * weights and let the later ones share (shared_source), as many distinct layers as fit next to a working margin
 * for the step's scratch and the KV of long contexts. A real checkpoint never shares: it fits or is refused. */
static int choose_distinct(struct cuda_model *cm, const struct dsv4_model *m, int n, dsv4_error *err) {
    const int NL = m->cfg.n_layers;
    cm->distinct = NL;
    if (!m->cfg.synthetic_holes) return 0;
    const uint64_t margin0 = (uint64_t)16 << 30, margin_r = (uint64_t)4 << 30;
    uint64_t *lb = calloc((size_t)NL * (size_t)n, sizeof *lb), fixed0 = 0, avail[CU_MAX_GPUS];
    if (!lb) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    for (int r = 0; r < n; r++) {
        cu_use(cm->gpu + r);
        size_t fb = 0, tb = 0;
        cu_mem_info(&fb, &tb);
        avail[r] = fb;
        for (int L = 0; L < NL; L++) {
            uploader c = { .cm = cm, .rank = r, .n_ranks = n, .synthetic = 1, .distinct = NL, .counting = 1 };
            cu_layer tmp;
            memset(&tmp, 0, sizeof tmp);
            if (r == 0) up_layer(&c, m, &m->layers[L], &tmp, n > 1, L);
            else up_layer_experts(&c, m, &m->layers[L], 1, L);
            lb[(size_t)r * NL + L] = c.bytes;
        }
    }
    cu_use(cm->gpu);
    uploader all = { .cm = cm, .rank = 0, .n_ranks = n, .synthetic = 1, .distinct = NL, .counting = 1 };
    up_model(&all, m);
    fixed0 = all.bytes;
    for (int L = 0; L < NL; L++) fixed0 -= lb[L];
    int D = NL;
    for (; D > 0; D--) {
        int fits = 1;
        for (int r = 0; r < n && fits; r++) {
            uint64_t need = (r ? margin_r : fixed0 + margin0);
            for (int L = 0; L < D; L++) need += lb[(size_t)r * NL + L];
            fits = need <= avail[r];
        }
        if (fits) break;
    }
    free(lb);
    int ok = D > 0;
    for (int L = D; L < NL && ok; L++) ok = shared_source(m, D, L) >= 0;
    if (!ok)
        return dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory: this synthetic model does not fit on %d GPU(s) even with layers "
                         "sharing weights (%d distinct layers fit)", n, D);
    cm->distinct = D;
    return 0;
}

/* Ranks 1 .. n-1 (GPUs gpu+1 ..): counted first on every GPU, then uploaded, then the communicators. */
static int init_ranks(struct cuda_model *cm, const struct dsv4_model *m, int n, dsv4_error *err) {
    cu_ep *ep = calloc(1, sizeof *ep);
    if (!ep || !(ep->rank = calloc((size_t)n, sizeof *ep->rank)) || !(ep->weight_bytes = calloc((size_t)n, sizeof(uint64_t)))) {
        if (ep) free(ep->rank);
        free(ep);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    ep->n = n;
    cm->ep = ep;   /* from here on release(cm) frees whatever exists */
    uint64_t need[CU_MAX_GPUS];
    int rc = 0;
    for (int r = 1; r < n && !rc; r++) {
        cu_use(cm->gpu + r);
        if (!(ep->rank[r].cm = new_cuda_model(m, cm->gpu + r, 0))) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        else {
            ep->rank[r].cm->distinct = cm->distinct;
            ep->rank[r].cm->pack_fp4 = cm->pack_fp4;
            rc = check_fit(ep->rank[r].cm, m, r, n, up_rank, &need[r], err);
        }
    }
    for (int r = 1; r < n && !rc; r++) {
        cu_use(cm->gpu + r);
        rc = upload(ep->rank[r].cm, m, r, n, up_rank, need[r], err);
        ep->weight_bytes[r] = ep->rank[r].cm->weight_bytes;
    }
    ep->weight_bytes[0] = cm->weight_bytes;
    if (!rc) {
        int gpus[CU_MAX_GPUS];
        for (int r = 0; r < n; r++) gpus[r] = cm->gpu + r;
        rc = cu_comm_open(n, gpus, &ep->comm, err);
    }
    cu_use(cm->gpu);
    return rc;
}

/* The switches read once per model load (docs/dsv4.1, ENVIRONMENT): unset or empty = the default, 1 = on, 0 = off;
 * anything else fails the load with one line. Each is a property of the model load, never of a step, so a query's
 * bits do not depend on its batch.
 *   DSV4_CUDA_GRAPHS    steps as CUDA graphs (cu_graph.cu), default on; 0 launches every kernel directly.
 *   DSV4_CUDA_PDL       inside those graphs, kernel -> kernel edges programmatic (cu_graph.cu): 1 from the upstream
 *                       kernel's launch completion, 2 (the default) from its blocks' exit, 0 plain edges; the same
 *                       bits every way. Run 51, decode at prompt 256 in three alternating rounds: 2 108.3-108.4
 *                       tok/s, 0 106.3-107.2 (the GPU suite passed with 2 exported, the same logits); 1 costs 12-14 %
 *                       (run 50: its early blocks hold SMs the kernel before still needs).
 *   DSV4_CUDA_MMA       OFFICIAL mode's FP8/FP4 linears of act-quantized rows on FP8 tensor cores (k_mma.cu) and its
 *                       linears of bf16-valued inputs with BF16 or FP8 weights on BF16 tensor cores (k_mma16.cu),
 *                       default on; 0 = both on CUDA cores (k_linear.cu). EXACT mode never uses them.
 *   DSV4_CUDA_GEMM      the FP8/FP4 tensor-core linears of >= CU_MMA_GEMM_MIN_T tokens (and the routed experts of
 *                       steps that large) as a shared-memory tiled GEMM (k_mma_gemm.cu): 1 its mma.sync block, 2 (the
 *                       default) / 3 its warpgroup block (fp16 wgmma in the order of sm_90's e4m3 expansion; two / four
 *                       warpgroups); 0 = k_mma.cu's
 *                       small tiles at every T. The same bits every way (process-wide: the last load's setting holds).
 *   DSV4_CUDA_STREAM    those linears (and the routed experts) at up to 8 tokens through the streaming kernel
 *                       (k_mma_stream.cu: a persistent grid, the weights by cp.async through shared memory), default
 *                       off: run 44 (the suite passed with it on, the same logits) timed it slower in the model, 80
 *                       vs 88 tok/s — it keeps more bytes in flight but spends as many instructions a byte as
 *                       k_mma.cu's kernels, and those are issue-bound; 0 = k_mma.cu's small tiles. The same bits
 *                       either way (test_gpu_stream); a property of the model load (cuda_model.mma_stream), passed to
 *                       every call.
 *   DSV4_CUDA_EXPERT_LEAN  FP4 routed experts of whole 128-column chunks at decode by k_mma.cu's k_mma_expert_lean
 *                       (mma_block's instructions cut to the arithmetic), default on: run 47 passed the GPU suite with it
 *                       on and off, the same logits, decode 97 → 105 tok/s (its first version hung three suite tests
 *                       in run 46: a lane-wise branch between two mma.sync, now warp-uniform and checked by the CPU
 *                       shim). 0 = k_mma_expert. The same bits either way (test_gpu_mma); process-wide, as
 *                       DSV4_CUDA_GEMM.
 *   DSV4_CUDA_EXPERT_PACK  OFFICIAL models (with DSV4_CUDA_MMA on) pack their FP4 routed experts of whole 128-column
 *                       chunks at load (cu_fp4_frag_pack, k_mma.cu: a 16-byte load a row and chunk, two and five
 *                       instructions a word to E4M3), read by k_mma_expert_frag and the expert GEMM; default on.
 *                       Run 68: one layer's experts 47.9 → 40.1 us at one token, 52.7 → 43.5 at 8; decode at prompt
 *                       256 114.0 / 114.5 → 119.4 / 117.6 tok/s. The same bits either way (test_gpu_mma, test_gpu_gemm,
 *                       cli.sh); a property of the model load. With it on DSV4_CUDA_EXPERT_LEAN does not matter: packed
 *                       experts have their own kernel.
 *   DSV4_CUDA_NATIVE_EXPERTS  OFFICIAL models (with DSV4_CUDA_MMA on) compute their FP4 routed experts of whole
 *                       128-column chunks on native FP8 tensor cores (k_expert_nat.cu: wgmma .e4m3, packed at load by
 *                       cu_fp4_nat_pack), default off. Native FP8 sums keep fewer bits than mma.sync's, so the
 *                       logits differ from the default's (runs 159-160: the calm model's first positions 1.27e-2
 *                       from the official goldens, past test_gpu_vs_cpu's 1e-2; 8K prefill +11 %, decode -8 %);
 *                       every step of such a model takes them, so its results are still equal across chunkings,
 *                       batches and restores (tests/gpu/cli.sh). Overrides DSV4_CUDA_EXPERT_PACK.
 *   DSV4_CUDA_IDX_MMA   OFFICIAL indexer scores on int8 tensor cores (k_indexer.cu, exact block sums of the FP4
 *                       operands), default on; 0 = the fp32 scores.
 *   DSV4_CUDA_ATT_MMA   OFFICIAL attention scores and P.V on bf16 tensor cores (k_attention.cu k_att_scores_mma /
 *                       k_att_pv_mma, and k_att_dec_mma at decode), default off: run 155 (H100, fp8 KV) measured it
 *                       faster at 8 / 64 / 256 streams (+3-4 %), at 128K and 1M contexts (+3 / +1 %), at the verify
 *                       step and at prefill (+14-17 %, runs 150-151), but slower at single-stream decode of short
 *                       contexts (111.4 vs 99.1 tok/s). EXACT mode never uses them.
 *   DSV4_CUDA_ATT_DEC   attention scores of a launch of few queries by k_attention.cu's k_att_scores_dec (each chunk's
 *                       rows and q staged in one phase of loads), default on; 0 = k_att_scores at every size. The
 *                       same bits either way (test_gpu_attention compares them). Run 45's ncu of a decode step:
 *                       k_att_scores 34 us a layer whatever the keys (its 16 slices wait on memory one after another);
 *                       run 44: the suite passed with it on. Until f32 rows were copied without their raw copy the
 *                       kernel did not fit f32 rows (the bench's default KV) and was never taken there.
 *   DSV4_CUDA_ATT_FUSED such a launch's scores, P.V and combination in one kernel, k_att_dec (two grid barriers:
 *                       its blocks are all resident), default off: runs 76-77 measured decode within noise of the
 *                       three kernels (runs 79-83: its first step, the same as k_att_scores_dec's, is a 25 us block
 *                       of copying and decoding 64 rows; the barriers cost ~2.5 us each); 1 = k_att_dec. The same bits
 *                       either way (test_gpu_attention compares them on every decode-sized launch).
 *   DSV4_CUDA_ATT_DEC_MMA  with DSV4_CUDA_ATT_MMA, such a launch's whole attention on tensor cores in one kernel,
 *                       k_att_dec_mma (the same two grid barriers), default on; 0 = the three tensor-core kernels at
 *                       every size. The same bits either way (test_gpu_attention compares them on every decode-sized
 *                       launch; tests/gpu/cli.sh the logits).
 *   DSV4_CUDA_BRANCH    a layer's chains that do not depend on each other run on a second stream, a branch of the
 *                       step's graph (cuda_step.c branch_fork): the shared expert beside the router and the routed
 *                       experts, the compressors' projections and the indexer's queries beside the query path;
 *                       default on. Each kernel gets the same inputs either way, so the same bits; 0 = one stream.
 *   DSV4_CUDA_HX_AHEAD  1 (the default): a step of at most CU_HX_AHEAD_MAX_T tokens with experts the host computes is
 *                       enqueued (graphed) whole before the host computes them, each hand-off a pair of kernels
 *                       (cuda_host_experts.h). The same rows in the same places, so the same bits. 0: launched
 *                       directly, the host answering each layer before the next is launched (the default until run
 *                       187: Flash at --gpu-mem 72 on an H100 decoded ~5 % faster ahead in runs 186-187;
 *                       docs/GPU_RUNS.md). */
static int env_choice(const char *name, int dflt, int max, const char *what, int *val, dsv4_error *err) {
    const char *v = getenv(name);
    *val = dflt;
    if (!v || !*v) return 0;
    if (v[0] >= '0' && v[0] <= '0' + max && !v[1]) {
        *val = v[0] - '0';
        return 0;
    }
    return dsv4_fail(err, DSV4_E_ARG, "%s is '%.40s': %s; %d is the default", name, v, what, dflt);
}
static int env_switch(const char *name, int dflt, const char *what, int *on, dsv4_error *err) {
    char both[160];
    snprintf(both, sizeof both, "1 (%s) or 0", what);
    return env_choice(name, dflt, 1, both, on, err);
}

int cuda_model_init(struct dsv4_model *m, const cuda_placement *p, dsv4_error *err) {
    const int gpu = p->gpu;
    int n_gpus = p->n_gpus, graphs_on, pdl_on /* CU_PDL_* */, mma_on, gemm_on, stream_on, lean_on, pack_on, native_on, idx_mma_on,
        idx_tiles_on, att_mma_on, att_dec_on, att_fused_on, att_dec_mma_on, branch_on, hx_ahead_on;
    if (env_switch("DSV4_CUDA_GRAPHS", 1, "CUDA graphs", &graphs_on, err) ||
        env_choice("DSV4_CUDA_PDL", CU_PDL_EXIT, CU_PDL_EXIT,
                   "0 (plain edges in the CUDA graphs), 1 (programmatic from launch completion) or 2 (from exit)", &pdl_on, err) ||
        env_switch("DSV4_CUDA_MMA", 1, "tensor cores in OFFICIAL mode", &mma_on, err) ||
        env_choice("DSV4_CUDA_GEMM", CU_GEMM_DEFAULT, CU_GEMM_HGMMA4,
                   "1 (the tiled GEMM for many tokens on mma.sync), 2 or 3 (on warpgroup MMAs, two or four a block) or 0 (off)",
                   &gemm_on, err) ||
        env_switch("DSV4_CUDA_STREAM", 0, "the streaming kernel for up to 8 tokens", &stream_on, err) ||
        env_switch("DSV4_CUDA_EXPERT_LEAN", 1, "the lean FP4 expert kernel", &lean_on, err) ||
        env_switch("DSV4_CUDA_EXPERT_PACK", 1, "FP4 routed experts packed for the tensor cores", &pack_on, err) ||
        env_switch("DSV4_CUDA_NATIVE_EXPERTS", 0, "FP4 routed experts on native FP8 tensor cores", &native_on, err) ||
        env_switch("DSV4_CUDA_IDX_MMA", 1, "indexer scores on tensor cores in OFFICIAL mode", &idx_mma_on, err) ||
        env_switch("DSV4_CUDA_IDX_TILES", 1, "indexer scores of prefill chunks in query tiles", &idx_tiles_on, err) ||
        env_switch("DSV4_CUDA_ATT_MMA", 0, "tensor-core attention in OFFICIAL mode", &att_mma_on, err) ||
        env_switch("DSV4_CUDA_ATT_DEC", 1, "the decode-sized attention scores kernel", &att_dec_on, err) ||
        env_switch("DSV4_CUDA_ATT_FUSED", 0, "a decode step's attention in one kernel", &att_fused_on, err) ||
        env_switch("DSV4_CUDA_ATT_DEC_MMA", 1, "a decode step's tensor-core attention in one kernel", &att_dec_mma_on, err) ||
        env_switch("DSV4_CUDA_BRANCH", 1, "a layer's independent chains on a second stream", &branch_on, err) ||
        env_switch("DSV4_CUDA_HX_AHEAD", 1, "steps with host experts enqueued ahead", &hx_ahead_on, err))
        return DSV4_E_ARG;
    if (n_gpus < 1) n_gpus = 1;
    if (n_gpus > CU_MAX_GPUS) return dsv4_fail(err, DSV4_E_ARG, "at most %d GPUs (asked for %d)", CU_MAX_GPUS, n_gpus);
    if (n_gpus > m->cfg.n_routed)
        return dsv4_fail(err, DSV4_E_ARG, "%d GPUs but only %d routed experts per layer to spread over them", n_gpus, m->cfg.n_routed);
    int rc = 0;
    for (int r = n_gpus - 1; r >= 0 && !rc; r--) rc = cu_select(gpu + r, err);   /* ends on rank 0's GPU */
    if (rc) {
        if (n_gpus > 1) dsv4_wrap(err, "--gpus %d uses GPUs %d..%d", n_gpus, gpu, gpu + n_gpus - 1);
        return rc;
    }
    if ((rc = check_shapes(&m->cfg, err))) return rc;
    struct cuda_model *cm = new_cuda_model(m, gpu, 1);
    if (!cm) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    /* packed experts have tensor-core readers only */
    cm->pack_fp4 = mma_on && m->mode == DSV4_MODE_OFFICIAL ? (native_on ? 2 : pack_on) : 0;
    uint64_t need = 0;
    /* a synthetic model given a budget keeps every layer distinct and puts what does not fit on the host */
    rc = m->cfg.synthetic_holes && p->gpu_mem ? 0 : choose_distinct(cm, m, n_gpus, err);
    if (!rc) rc = place_experts(cm, m, p, err);
    if (!rc) rc = check_fit(cm, m, 0, n_gpus, up_model, &need, err);
    if (!rc) rc = upload(cm, m, 0, n_gpus, up_model, need, err);
    if (!rc && n_gpus > 1) rc = init_ranks(cm, m, n_gpus, err);
    if (!rc && !(cm->graphs = cu_graphs_new(pdl_on))) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    if (!rc && branch_on && (!(cm->side = cu_stream_new()) || !(cm->fork_ev = cu_event_new()) || !(cm->join_ev = cu_event_new())))
        rc = dsv4_fail(err, DSV4_E_UNSUPPORTED, "cuda: cannot create a second stream and its events on GPU %d (DSV4_CUDA_BRANCH=0 "
                       "does without)", gpu);
    if (rc) {
        release(cm);
        return rc;
    }
    cm->key_limit = cu_attention_key_limit(m->cfg.n_heads, m->cfg.head_dim);
    cm->graphs_on = graphs_on;
    cm->mma_on = mma_on;   /* used in OFFICIAL steps only (cuda_step.c) */
    cu_mma_gemm_set(gemm_on ? CU_MMA_GEMM_MIN_T : 0, CU_MMA_GEMM_MIN_BLOCKS, gemm_on ? CU_MMA_GEMM_MIN_TILES : 0);   /* the same bits either way: a speed switch */
    cu_mma_gemm_set_kind(gemm_on);
    cm->mma_stream = stream_on;   /* the same bits either way: a speed switch */
    cu_mma_expert_lean(lean_on);   /* the same bits either way: a speed switch (process-wide: the last load's setting holds) */
    cm->idx_mma_on = idx_mma_on;
    cm->idx_tiles_on = idx_tiles_on;   /* the same bits either way: a speed switch */
    cm->att_mma_on = att_mma_on;
    cm->att_dec_on = att_dec_on;
    cm->att_fused_on = att_fused_on;
    cm->att_dec_mma_on = att_dec_mma_on;
    cm->branch_on = branch_on;
    cm->hx_ahead_on = hx_ahead_on;
    /* the host's expert loops come one GPU stretch apart: the workers spin across it (cuda_host_experts.h) */
    if (cm->hx && cuda_hx_hands_off(cm->hx)) dsv4_pool_set_spin(m->pool, CU_HX_POOL_SPIN_US);
    m->cuda = cm;
    m->state_mem = &seq_mem_cuda;
    if (m->progress) {
        char name[128];
        cu_device_name(name, sizeof name);
        fprintf(stderr, "dsv4: %.2f GiB of weights on GPU %d (%s)\n", cm->weight_bytes / 1073741824.0, gpu, name);
        if (cm->hx) {
            const int L = m->cfg.n_layers, E = m->cfg.n_routed;
            const double one = (double)dsv4_expert_weight_bytes(&m->layers[0], 0) / 1073741824.0;
            const int64_t n_bus = cm->hx->map.n_bus, n_cpu = cm->hx->map.n_host - n_bus;
            if (cm->hx->map.n_split)
                fprintf(stderr, "dsv4: %lld of %lld routed experts in host memory%s (%.2f GiB, page-locked), each token's routes "
                        "to them split: %d %% over the bus to the GPU, the rest to %d threads (--bus-by-token)\n",
                        (long long)cm->hx->map.n_host, (long long)L * E,
                        p->profile ? ", the least used by the routing profile" : ", spread evenly", n_cpu * one,
                        cm->hx->map.split_pct, dsv4_pool_threads(m->pool));
            else
                fprintf(stderr, "dsv4: %lld of %lld routed experts in host memory%s: %lld (%.2f GiB, %s) computed by %d threads, "
                        "%lld (%.2f GiB, page-locked) by the GPU over the bus (--bus-share %.2f)\n",
                        (long long)cm->hx->map.n_host, (long long)L * E,
                        p->profile ? ", the least used by the routing profile" : ", spread evenly", (long long)n_cpu, n_cpu * one,
                        st_memory_words(cm->hx->memory), dsv4_pool_threads(m->pool), (long long)n_bus, n_bus * one,
                        cm->hx->bus_pct / 100.0);
            if (cm->hx->synth_distinct < cm->hx->map.n_host)
                fprintf(stderr, "dsv4: synthetic host experts: %d with bytes of their own (%.2f GiB), the other %lld share "
                        "them in a cycle (host memory)\n", cm->hx->synth_distinct, cm->hx->synth_bytes / 1073741824.0,
                        (long long)cm->hx->map.n_host - cm->hx->synth_distinct);
        }
        for (int r = 1; r < n_gpus; r++)
            fprintf(stderr, "dsv4: %.2f GiB of routed experts on GPU %d (experts %d..%d of every layer)\n",
                    cm->ep->weight_bytes[r] / 1073741824.0, gpu + r, expert_first(m->cfg.n_routed, n_gpus, r),
                    expert_first(m->cfg.n_routed, n_gpus, r + 1) - 1);
    }
    return 0;
}

void cuda_graphs_set(struct dsv4_model *m, int on, int drop_test) {
    struct cuda_model *cm = m->cuda;
    if (!cm) return;
    cu_use(cm->gpu);
    cu_finish(cm->st, "switching CUDA graphs", NULL);   /* no graph of this model is in flight */
    cm->graphs_on = on;
    if (cm->graphs) cu_graphs_drop_test(cm->graphs, drop_test);
}

int cuda_mma_on(const struct dsv4_model *m) { return m->cuda && m->cuda->mma_on; }

void cuda_graphs_get(const struct dsv4_model *m, cuda_graph_info *info) {
    memset(info, 0, sizeof *info);
    if (!m->cuda) return;
    info->on = m->cuda->graphs_on;
    if (!m->cuda->graphs) return;
    const cu_graph_counts *n = cu_graphs_counts(m->cuda->graphs);
    info->graphed_steps = n->graphed_steps;
    info->direct_steps = n->direct_steps;
    info->captures = n->captures;
    info->instantiations = n->instantiations;
    info->updates = n->updates;
    info->launches = n->launches;
    info->programmatic_edges = n->programmatic_edges;
    info->joins = n->joins;
    info->host_ms = n->host_ms;
}

int cuda_distinct_layers(const struct dsv4_model *m) { return m->cuda ? m->cuda->distinct : 0; }

int cuda_gpus(const struct dsv4_model *m) { return !m->cuda ? 0 : m->cuda->ep ? m->cuda->ep->n : 1; }

uint64_t cuda_gpu_weight_bytes(const struct dsv4_model *m, int r) {
    if (!m->cuda || r < 0 || r >= cuda_gpus(m)) return 0;
    return m->cuda->ep ? m->cuda->ep->weight_bytes[r] : m->cuda->weight_bytes;
}

void cuda_model_free(struct dsv4_model *m) {
    if (!m->cuda) return;
    release(m->cuda);
    m->cuda = NULL;
    m->state_mem = &seq_mem_host;
}
int64_t cuda_bus_experts(const struct dsv4_model *m) {
    const cu_host_experts *hx = m->cuda ? m->cuda->hx : NULL;
    return hx ? hx->map.n_bus : 0;
}
int64_t cuda_split_experts(const struct dsv4_model *m) {
    const cu_host_experts *hx = m->cuda ? m->cuda->hx : NULL;
    return hx ? hx->map.n_split : 0;
}

void cuda_hx_fail_next(struct dsv4_model *m, int k) {
    if (m->cuda && m->cuda->hx) m->cuda->hx->fail_at = k;
}

const uint8_t *cuda_expert_owners(const struct dsv4_model *m) {
    const cu_host_experts *hx = m->cuda ? m->cuda->hx : NULL;
    return hx ? hx->map.owner : NULL;
}

int64_t cuda_host_experts(const struct dsv4_model *m, cuda_host_work *w) {
    const cu_host_experts *hx = m->cuda ? m->cuda->hx : NULL;
    if (w) *w = hx ? (cuda_host_work){ hx->host_ms, hx->wait_ms, hx->host_bytes, hx->ahead_steps } : (cuda_host_work){ 0, 0, 0, 0 };
    return hx ? hx->map.n_host : 0;
}

int cuda_count_routes(struct dsv4_model *m, int on, dsv4_error *err) {
    struct cuda_model *cm = m->cuda;
    cu_use(cm->gpu);
    cu_finish(cm->st, "counting routes", NULL);
    cu_free(cm->route_counts);
    cm->route_counts = NULL;
    if (!on) return 0;
    const size_t n = sizeof(unsigned long long) * (size_t)m->cfg.n_layers * (size_t)m->cfg.n_routed;
    if (!(cm->route_counts = cu_malloc(n)) || cu_zero(cm->route_counts, n)) {
        cu_free(cm->route_counts);
        cm->route_counts = NULL;
        return dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory for the route counters");
    }
    return 0;
}

int cuda_route_counts(const struct dsv4_model *m, uint64_t *counts, dsv4_error *err) {
    const struct cuda_model *cm = m->cuda;
    if (!cm->route_counts) return dsv4_fail(err, DSV4_E_ARG, "routes are not being counted");
    cu_use(cm->gpu);
    int rc = cu_finish(cm->st, "counting routes", err);
    if (rc) return rc;
    if (cu_download(counts, cm->route_counts, sizeof(uint64_t) * (size_t)m->cfg.n_layers * (size_t)m->cfg.n_routed))
        return dsv4_fail(err, DSV4_E_STATE, "CUDA error reading the route counters");
    return 0;
}

#else
typedef int dsv4_cuda_model_unused; /* built only with CUDA=1 */
#endif
