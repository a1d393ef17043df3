/* dsv4_step on the GPU: the CPU step's order of operations (core/forward.c, attention.c, moe.c, hc.c), as one
 * fixed sequence of kernel launches over the whole ragged batch on the model's stream. The host only validates,
 * reserves, uploads the step's metadata (tokens, positions, items, the sequences' state addresses) once, and
 * at the end copies back the logits (and hidden rows / features) that were asked for. Nothing in between
 * depends on a value computed on the device, so the launch sequence is captured and run as CUDA graphs (below,
 * "the step as CUDA graphs"; DSV4_CUDA_GRAPHS=0 at load launches it directly, with the same bits).
 *
 * Every kernel is batch-invariant (cu_kernels.h), so a sequence's bits do not depend on how its tokens were
 * split into steps or on the other sequences of a step. */
#ifdef DSV4_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cu_runtime.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/cu_mma.h"
#include "backend/cuda/cuda_ep.h"
#include "backend/cuda/cuda_host_experts.h"
#include "backend/cuda/cu_graph.h"
#include "core/forward.h"
#include "core/profile.h"
#include "model/inventory.h"
#include "state/sequence.h"
#include "util/error.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- scratch ----------------------------------------------------------------------------------------------------- */

void cuda_workspace_free(cu_workspace *ws) {
    for (int i = 0; i < ws->n_bufs; i++) cu_free(ws->bufs[i]);
    if (ws->idx_offgrid) cu_free_host(ws->idx_offgrid);
    free(ws->bufs);
    memset(ws, 0, sizeof *ws);
}

typedef struct {
    cu_workspace *ws;
    size_t bytes;
    int counting, failed, cap;
} ws_alloc;

static void *take(ws_alloc *a, size_t n) {
    a->bytes += (n + 255) & ~(size_t)255;
    if (a->counting || a->failed) return NULL;
    void *p = cu_malloc(n);
    if (!p) { a->failed = 1; return NULL; }
    if (a->ws->n_bufs == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        void **nb = realloc(a->ws->bufs, sizeof(void *) * (size_t)a->cap);
        if (!nb) { cu_free(p); a->failed = 1; return NULL; }
        a->ws->bufs = nb;
    }
    a->ws->bufs[a->ws->n_bufs++] = p;
    return p;
}
#define TAKE(field, count) (ws->field = take(a, sizeof(*ws->field) * (size_t)(count)))

/* Tiles a step of T tokens can need: sum over experts of ceil(n_e / TILE) <= T*K / TILE + (experts in use). The
 * expert kernels launch this many (the plan is on the device); sized by the step's T, not the scratch's
 * capacity, or a decode step would launch the tiles of the longest prefill and retire them empty. */
static int moe_max_tiles(const dsv4_config *c, int T) { return cu_moe_tiles_max((int64_t)T * c->n_act, c->n_routed, CU_MOE_TILE); }

static void lay_out(ws_alloc *a, const dsv4_config *c, int T, int items, int64_t idx_rows, int64_t att_keys, size_t kv_row_bytes) {
    cu_workspace *ws = a->ws;
    const int64_t d = c->dim, hc = c->hc_mult, D = c->head_dim, H = c->n_heads, K = c->n_act, I = c->moe_inter;
    const int64_t P = (int64_t)T * K;
    TAKE(X, T * hc * d); TAKE(u, T * d); TAKE(xn, T * d); TAKE(x8, T * d); TAKE(sub, T * d);
    TAKE(mixraw, T * hc_mix_count(c->hc_mult)); TAKE(mix, T * CU_MIX);
    TAKE(qr, T * c->q_lora); TAKE(q, T * H * D); TAKE(kv, T * D); TAKE(o, T * H * D); TAKE(z, T * c->o_groups * c->o_lora);
    TAKE(kvs, T * kv_row_bytes);
    TAKE(ck, T * 2 * D); TAKE(cz, T * 2 * D);
    const int64_t cI = c->index_head_dim > 0 ? c->index_head_dim : 1, nI = c->index_n_heads > 0 ? c->index_n_heads : 1;
    TAKE(ick, T * 2 * cI); TAKE(icz, T * 2 * cI); TAKE(qi, T * nI * cI); TAKE(wi, T * nI);
    TAKE(sel, T * (c->index_topk > 0 ? c->index_topk : 1)); TAKE(n_sel, T);
    TAKE(router, T * c->n_routed); TAKE(route_w, P); TAKE(route_e, P);
    ws->max_tiles = moe_max_tiles(c, T);
    ws->plan.pair_token = take(a, sizeof(int32_t) * (size_t)P);
    ws->plan.pair_weight = take(a, sizeof(float) * (size_t)P);
    ws->plan.tile_expert = take(a, sizeof(int32_t) * (size_t)ws->max_tiles);
    ws->plan.tile_first = take(a, sizeof(int32_t) * (size_t)ws->max_tiles);
    ws->plan.tile_count = take(a, sizeof(int32_t) * (size_t)ws->max_tiles);
    ws->plan.n_tiles = take(a, sizeof(int32_t));
    ws->plan.token_pairs = take(a, sizeof(int32_t) * (size_t)P);
    TAKE(eg, P * I); TAKE(ev, P * I); TAKE(ey, P * d); TAKE(seg, T * I); TAKE(sev, T * I); TAKE(ys, T * d);
    TAKE(feat, T * (c->n_dspark_targets > 0 ? c->n_dspark_targets : 1) * d);
    TAKE(mtp_h, T * hc * d); TAKE(mtp_out, T * hc * d);
    TAKE(head_x, CU_HEAD_ROWS * d); TAKE(logits, (int64_t)CU_HEAD_ROWS * c->vocab_size); TAKE(head_rows, T);
    TAKE(sample_w, (int64_t)CU_HEAD_ROWS * c->vocab_size); TAKE(sample_req, items); TAKE(sample_tok, items);
    const int dsp = c->n_dspark_targets > 0 && c->dspark_markov_rank > 0;   /* the DSpark drafter's heads */
    TAKE(dsp_ids, CU_HEAD_ROWS + 1); TAKE(dsp_req, CU_HEAD_ROWS); TAKE(dsp_z, CU_HEAD_ROWS);
    TAKE(dsp_cat, dsp ? (int64_t)CU_HEAD_ROWS * (d + c->dspark_markov_rank) : 1);
    TAKE(dsp_probs, dsp ? (int64_t)CU_HEAD_ROWS * c->vocab_size : 1);
    TAKE(idx_scores, (int64_t)(T < CU_INDEX_CHUNK ? T : CU_INDEX_CHUNK) * (idx_rows > 0 ? idx_rows : 1));
    TAKE(idx_qc, T * nI * cI); TAKE(idx_qu, T * nI * (cI / 32 > 0 ? cI / 32 : 1));
    TAKE(idx_split, cu_index_split_words(idx_rows > 0 ? idx_rows : 1));
    {   /* packed act-quantized rows for the tensor-core linears (cu_mma.h) */
        int ky = c->q_lora > c->moe_inter ? c->q_lora : c->moe_inter;
        if (c->o_groups * c->o_lora > ky) ky = c->o_groups * c->o_lora;
        TAKE(xq, T * cu_mma_ld((int)d)); TAKE(xqs, T * cu_mma_lds((int)d));
        TAKE(yq, T * cu_mma_ld(ky)); TAKE(yqs, T * cu_mma_lds(ky));
        TAKE(egq, P * cu_mma_ld((int)I)); TAKE(egqs, P * cu_mma_lds((int)I));
        /* bf16 copies of a bf16-valued input: the widest is o [T][H*D] (wo_a), or the head's rows */
        const int64_t wide = cu_mma16_ld((int)(H * D)) > cu_mma16_ld((int)d) ? cu_mma16_ld((int)(H * D)) : cu_mma16_ld((int)d);
        const int64_t nb = T * wide > (int64_t)CU_HEAD_ROWS * cu_mma16_ld((int)d) ? T * wide : (int64_t)CU_HEAD_ROWS * cu_mma16_ld((int)d);
        TAKE(xb, nb);
    }
    ws->att_floats = cu_attention_scratch_floats(T, (int)H, (int)D, att_keys);
    TAKE(att, ws->att_floats);
    TAKE(att_bar, 2);
    TAKE(tok, T); TAKE(item_of, T); TAKE(pos, T); TAKE(items, items); TAKE(sl, (int64_t)c->n_layers * items);
}

/* Scratch for a step of T tokens in `items` items whose queries see at most idx_rows indexer rows and att_keys
 * attention keys. On failure
 * the old scratch is gone too (nothing in it outlives a step) and the error gives the numbers.
 * Capacities grow by half at least: a decoding sequence sees one more indexer row every 4 tokens, and growing to
 * the exact need freed and allocated the whole scratch that often (run 24: decode after a 4K context at a third
 * of the speed after a short one). If the larger scratch does not fit, the exact one is tried. */
static int ws_try(struct dsv4_model *m, int nT, int nI, int64_t nR, int64_t nK, size_t rowb) {
    cu_workspace *ws = &m->cuda->ws;
    cuda_workspace_free(ws);
    ws_alloc a = { ws, 0, 0, 0, 0 };
    lay_out(&a, &m->cfg, nT, nI, nR, nK, rowb);
    static const unsigned zero2[2] = { 0, 0 };   /* k_att_dec's barrier words start at zero (cu_kernels.h) */
    if (!a.failed && cu_upload(ws->att_bar, zero2, sizeof zero2)) a.failed = 1;
    if (!a.failed && !(ws->idx_offgrid = cu_malloc_mapped(sizeof *ws->idx_offgrid))) a.failed = 1;
    if (ws->idx_offgrid) *ws->idx_offgrid = 0;
    if (a.failed) {
        cuda_workspace_free(ws);
        return -1;
    }
    ws->T_cap = nT;
    ws->items_cap = nI;
    ws->idx_rows_cap = nR;
    ws->att_keys_cap = nK;
    return 0;
}

static int64_t grown(int64_t need, int64_t cap, int64_t floor) {
    if (need <= cap) return cap;
    const int64_t half_more = cap + cap / 2;
    const int64_t n = need > half_more ? need : half_more;
    return n > floor ? n : floor;
}

static int ws_ensure(struct dsv4_model *m, int T, int items, int64_t idx_rows, int64_t att_keys, dsv4_error *err) {
    struct cuda_model *cm = m->cuda;
    cu_workspace *ws = &cm->ws;
    if (T <= ws->T_cap && items <= ws->items_cap && idx_rows <= ws->idx_rows_cap && att_keys <= ws->att_keys_cap) return 0;
    const size_t rowb = kv_row_bytes(m->kv_format, KV_ROW_MAIN, m->cfg.head_dim, m->cfg.rope_dim);
    const int oT = ws->T_cap, oI = ws->items_cap;
    const int64_t oR = ws->idx_rows_cap, oK = ws->att_keys_cap;
    const int nT = (int)grown(T, oT, 16), nI = (int)grown(items, oI, 4);
    const int64_t nR = grown(idx_rows, oR, 1024), nK = grown(att_keys, oK, 1024);
    if (!ws_try(m, nT, nI, nR, nK, rowb)) return 0;
    /* the exact need (the capacities kept where they were larger) */
    const int eT = T > oT ? T : oT, eI = items > oI ? items : oI;
    const int64_t eR = idx_rows > oR ? idx_rows : oR, eK = att_keys > oK ? att_keys : oK;
    if (!ws_try(m, eT < 16 ? 16 : eT, eI < 4 ? 4 : eI, eR, eK, rowb)) return 0;
    size_t fb = 0, tb = 0;
    cu_mem_info(&fb, &tb);
    ws_alloc cnt = { ws, 0, 1, 0, 0 };
    lay_out(&cnt, &m->cfg, eT < 16 ? 16 : eT, eI < 4 ? 4 : eI, eR, eK, rowb);
    memset(ws, 0, sizeof *ws);
    return dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory: a step of %d tokens needs %.2f GiB of scratch, %.2f GiB are free",
                     T, cnt.bytes / 1073741824.0, fb / 1073741824.0);
}

/* ---- profile --------------------------------------------------------------------------------------------------- */

void cuda_profile(struct dsv4_model *m, int on) {
    if (!m->cuda) return;
    memset(&m->cuda->prof, 0, sizeof m->cuda->prof);
    m->cuda->prof.on = on;
}

double cuda_copy_bandwidth_gbs(const struct dsv4_model *m) {
    return m->cuda ? cu_copy_bandwidth_gbs((size_t)1 << 31, 5) : -1;
}

void cuda_profile_report(const struct dsv4_model *m, void *file) {
    static const char *const names[ST_COUNT] = { "embed", "mHC + norms", "q/kv projections", "compressors", "indexer", "attention",
                                           "output projection", "router + plan", "routed experts", "shared expert", "head",
                                           "host (validate, upload, copy back)" };
    if (!m->cuda || !m->cuda->prof.steps) return;
    const cu_profile *p = &m->cuda->prof;
    profile_stage_table((FILE *)file, "each boundary waits for the GPU", names, p->ms, ST_COUNT, p->steps);
}

/* ---- one step -------------------------------------------------------------------------------------------------- */

typedef struct {
    struct dsv4_model *m;
    struct cuda_model *cm;
    cu_workspace *ws;
    cu_stream st;
    int T, n_items, official;
    cu_kvlay main, index;
    int64_t idx_rows;          /* most indexer rows a query of the step sees */
    int64_t hca_rows;          /* most ratio-128 rows a query sees */
    int rc;                    /* a failure inside the launch sequence (the multi-GPU transport), reported at the end */
    dsv4_error *err;
    int mma;                   /* OFFICIAL and cuda_model.mma_on: FP8/FP4 linears of act-quantized rows on tensor cores,
                                * and the linears of bf16-valued rows (linear16) */
    int branched;              /* launches on the side stream not yet joined (branch_end, branch_join) */
    int hx_ahead;              /* host experts handed off by kernels, the step enqueued ahead (cuda_host_experts.h) */
} step_ctx;

/* End of a stage: with profiling on, wait for the GPU and charge the time since the last mark to `stage`. */
static void mark(step_ctx *s, int stage) {
    cu_profile *p = &s->cm->prof;
    if (!p->on) return;
    cu_finish(s->st, "profile", NULL);
    const double t = cpu_profile_now_ms();
    p->ms[stage] += t - p->t_last;
    p->t_last = t;
}

static cu_kvlay lay_of(const kv_layout *l) {
    cu_kvlay k = { l->fmt, l->kind, l->width, l->rope, l->nope, (int)l->bytes };
    return k;
}

/* OFFICIAL rows x [T][K] packed for the tensor-core linears (cu_mma.h) into q / qs: the packing quantizes them by
 * act_quant's rule, so x may be raw or already act-quantized (the same products either way). */
static void pack_if(step_ctx *s, const float *x, int K, uint8_t *q, float *qs) {
    if (s->mma) cu_mma_pack_act(s->st, x, K, s->T, K, q, cu_mma_ld(K), qs, cu_mma_lds(K), NULL);
}

/* Whether this step runs weight w on tensor cores (cu_mma_takes: its format and shape, never T). */
static int mma_takes(const step_ctx *s, const dsv4_weight *w) { return s->mma && cu_mma_takes(w); }

/* Whether a linear reading the fp32 act-quantized copy of its input runs in this OFFICIAL step: one of w1, w2 (w2
 * may be NULL) on CUDA cores. The tensor-core linears read the packed copy, which quantizes by itself, so without
 * such a reader the act_quant kernel is skipped (run 32: 6 of them a layer, ~5.5 us each at one token). */
static int cuda_core_reader(const step_ctx *s, const dsv4_weight *w1, const dsv4_weight *w2) {
    return !mma_takes(s, w1) || (w2 && !mma_takes(s, w2));
}

/* y [T][w->rows] = x w^T, x [T][w->cols] act-quantized (OFFICIAL), the output rounded to BF16 (OFFICIAL): on
 * tensor cores from the packed copy q / qs when mma_takes(w), the rounding in the kernel's epilogue; else on CUDA
 * cores (k_linear.cu) from x, which the caller quantized then (cuda_core_reader). */
static void linear_q(step_ctx *s, const dsv4_weight *w, const float *x, const uint8_t *q, const float *qs, float *y) {
    const int K = w->cols, N = w->rows;
    if (mma_takes(s, w)) {
        /* cu_mma_takes accepted the weight and the packed buffers are the workspace's: a refusal is a bug, and x
         * was not quantized for the CUDA cores, so it ends the step instead of falling back */
        dsv4_error e;
        if (cu_mma_linear(s->st, w, q, cu_mma_ld(K), qs, cu_mma_lds(K), s->T, y, N, s->official, s->cm->mma_stream, &e) &&
            !s->rc)
            s->rc = dsv4_fail(s->err, DSV4_E_STATE, "cuda: %s", e.msg);
        return;
    }
    cu_linear(s->st, w, x, s->T, K, y, N);
    if (s->official) cu_round_bf16(s->st, y, (int64_t)s->T * N);
}

/* linear_q of two weights over the same input: one launch when both run on tensor cores (cu_mma_linear_pair: the
 * same bits as two, twice the blocks for a decode step's small weights), else linear_q each. */
static void linear_q_pair(step_ctx *s, const dsv4_weight *wa, float *ya, const dsv4_weight *wb, float *yb, const float *x, const uint8_t *q,
                          const float *qs) {
    const int K = wa->cols;
    if (mma_takes(s, wa) && mma_takes(s, wb) && wa->fmt == wb->fmt && wb->cols == K) {
        dsv4_error e;   /* both taken, the buffers the workspace's: a refusal is a bug (as in linear_q) */
        if (cu_mma_linear_pair(s->st, wa, ya, wa->rows, wb, yb, wb->rows, q, cu_mma_ld(K), qs, cu_mma_lds(K), s->T, s->official,
                               s->cm->mma_stream, &e) &&
            !s->rc)
            s->rc = dsv4_fail(s->err, DSV4_E_STATE, "cuda: %s", e.msg);
        return;
    }
    linear_q(s, wa, x, q, qs, ya);
    linear_q(s, wb, x, q, qs, yb);
}

/* OFFICIAL rows x [T][K] whose values are bf16 (a norm's output, the attention's output: the step rounded them)
 * packed as bf16 into ws->xb for the BF16-input tensor-core linears (cu_mma.h); 1 when packed. */
static int pack16_if(step_ctx *s, const float *x, int T, int K) {
    return s->mma && !cu_mma16_pack(s->st, x, K, T, K, s->ws->xb, cu_mma16_ld(K), NULL);
}

static void round_if(step_ctx *s, float *x, int64_t n) {
    if (s->official) cu_round_bf16(s->st, x, n);
}

/* y [T][ldy] = x w^T for bf16-valued rows x [T][ldx] (wo_a, the compressors, weights_proj, the router, the head:
 * spec §3.6's BF16 and fp32 linears whose input is a bf16 tensor), group g of `groups` reading the columns from
 * g * group_x on: on tensor cores from ws->xb when pack16_if packed x and cu_mma16_linear takes the weight (BF16, or
 * FP8 of a supported shape: a property of the weight, never of T), else on CUDA cores (k_linear.cu). round: the
 * output rounded to bf16 in OFFICIAL mode (the tensor cores' epilogue, else round_if). */
static void linear16(step_ctx *s, int packed, const dsv4_weight *w, int groups, const float *x, int T, int ldx, int group_x, float *y,
                     int ldy, int round) {
    if (packed && !cu_mma16_linear(s->st, w, groups, s->ws->xb, cu_mma16_ld(ldx), group_x, T, y, ldy, round && s->official, NULL)) return;
    if (groups > 1) cu_linear_grouped(s->st, w, groups, x, T, ldx, group_x, y, ldy);
    else cu_linear(s->st, w, x, T, ldx, y, ldy);
    if (round) round_if(s, y, (int64_t)T * ldy);
}
static void quant_rows_if(step_ctx *s, float *x, int rows, int n) {
    if (s->official) cu_act_quant(s->st, x, n, x, n, rows, n, 128, 0);
}

/* A branch: launches that depend on nothing the main chain computes after this point, and that nothing in it reads
 * before branch_join, enqueued on the model's second stream (DSV4_CUDA_BRANCH): forked from the main stream here,
 * so they see everything enqueued before. In a captured step the branch is a parallel path of the graph, so its
 * kernels run beside the main chain's, which leave most of the GPU idle at decode (each waits on its own latency).
 * Every kernel gets the same inputs in either order, so the bits are those of one stream. branch_fork returns the
 * main stream to give to branch_end (NULL: no branch, everything stays on s->st). Branches forked before a join run
 * one after another on the side stream (a step_attention has two: the compressors, then idx_wq_b). Not under the
 * per-stage profiler, whose marks wait for one stream. */
static cu_stream branch_fork(step_ctx *s) {
    struct cuda_model *cm = s->cm;
    if (!cm->branch_on || cm->prof.on) return NULL;
    cu_stream main = s->st;
    cu_event_record(cm->fork_ev, main);
    cu_stream_wait(cm->side, cm->fork_ev);
    s->st = cm->side;
    return main;
}
static void branch_end(step_ctx *s, cu_stream main) {
    if (!main) return;
    cu_event_record(s->cm->join_ev, s->st);
    s->st = main;
    s->branched = 1;
}
/* The main stream's later launches wait for everything forked so far (a join edge in the graph: the side stream runs
 * its branches in order, so the last one's end covers them all). */
static void branch_join(step_ctx *s) {
    if (!s->branched) return;
    cu_stream_wait(s->st, s->cm->join_ev);
    s->branched = 0;
}

/* hc_pre + the sub-layer's RMSNorm: ws->X -> ws->xn (and ws->mix for hc_post). */
static void step_hc_pre(step_ctx *s, const cu_hc *h, const float *norm) {
    const dsv4_config *c = &s->m->cfg;
    cu_workspace *ws = s->ws;
    const int nmix = hc_mix_count(c->hc_mult);
    cu_linear(s->st, &h->fn, ws->X, s->T, c->hc_mult * c->dim, ws->mixraw, nmix);
    /* the RMSNorm into xn fused (cu_kernels.h), and with tensor cores xn packed into ws->xq for every FP8/FP4 linear
     * that reads it (wq_a, wkv; the routed and shared experts) and into ws->xb for the BF16-input ones (the
     * compressors, weights_proj, the router: xn_packed16) */
    cu_hc_pre_finish(s->st, s->official, ws->mixraw, ws->X, s->T, c->hc_mult, c->dim, h->base, h->scale, c->hc_eps, c->norm_eps,
                     c->hc_iters, ws->u, ws->mix, norm, ws->xn, s->mma ? ws->xq : NULL, cu_mma_ld(c->dim), ws->xqs,
                     cu_mma_lds(c->dim), s->mma ? ws->xb : NULL, cu_mma16_ld(c->dim));
}

/* Whether ws->xb holds xn as bf16 (step_hc_pre wrote it with tensor cores on; wo_a's packing of the attention's
 * output replaces it later in the sub-layer, after the compressors have read it). */
static int xn_packed16(const step_ctx *s) { return s->mma; }

/* The query and key projections (core/attention.c attention_qkv): ws->q [T][H][D] and ws->kv [T][D], normalised
 * and rotated later by cu_attn_prepare (step_attention); ws->qr (the indexer's input); ws->x8 the OFFICIAL FP8 copy
 * of ws->xn. index (a ratio-4 layer of the model's steps): also the indexer's queries ws->qi = idx_wq_b qr, on a
 * branch beside wq_b (both read the packed qr; step_attention joins before cu_attn_prepare reads qi). */
static void attn_project(step_ctx *s, const cu_layer *ly, int index) {
    const dsv4_config *c = &s->m->cfg;
    cu_workspace *ws = s->ws;
    const int T = s->T, d = c->dim;
    /* FP8 linears see their input quantized per 128 columns (OFFICIAL); compressors and weights_proj read xn */
    const float *x8 = ws->xn;
    if (s->official) {
        if (cuda_core_reader(s, &ly->wq_a, &ly->wkv)) {
            cu_act_quant(s->st, ws->xn, d, ws->x8, d, T, d, 128, 0);
            x8 = ws->x8;
        }
    }   /* xn is packed in ws->xq by step_hc_pre */
    linear_q_pair(s, &ly->wq_a, ws->qr, &ly->wkv, ws->kv, x8, ws->xq, ws->xqs);   /* wkv reads the same rows */
    /* q_norm; with tensor cores qr packed into ws->yq by the same kernel (also the indexer's wq_b input) */
    cu_rmsnorm_pack(s->st, s->official, ws->qr, c->q_lora, ly->q_norm, c->q_lora, c->norm_eps, ws->qr, c->q_lora, T,
                    s->mma ? ws->yq : NULL, cu_mma_ld(c->q_lora), ws->yqs, cu_mma_lds(c->q_lora));
    if (cuda_core_reader(s, &ly->wq_b, ly->ratio == 4 ? &ly->idx_wq_b : NULL)) quant_rows_if(s, ws->qr, T, c->q_lora);
    if (index) {
        const cu_stream br = branch_fork(s);
        linear_q(s, &ly->idx_wq_b, ws->qr, ws->yq, ws->yqs, ws->qi);
        branch_end(s, br);
    }
    linear_q(s, &ly->wq_b, ws->qr, ws->yq, ws->yqs, ws->q);
}

/* ws->o [T][H][D] -> the sub-layer's output ws->sub [T][d] through the grouped wo_a (group g's heads through rows
 * [g*o_lora, (g+1)*o_lora)) and wo_b (core/attention.c attention_output), then mHC's post of it into ws->X: at few
 * tokens on tensor cores in wo_b's epilogue (cu_mma_linear_post: the same bytes in X, one launch fewer; ws->sub is
 * not written then), else cu_hc_post after it. */
static void attn_output(step_ctx *s, const cu_layer *ly) {
    const dsv4_config *c = &s->m->cfg;
    cu_workspace *ws = s->ws;
    const int T = s->T, H = c->n_heads, D = c->head_dim;
    const int G = c->o_groups, HD_G = H * D / G, zl = G * c->o_lora;
    /* one launch for all groups (run 18's ncu: 8 launches of 1024 rows each filled a tenth of the GPU); o is bf16 */
    linear16(s, pack16_if(s, ws->o, T, H * D), &ly->wo_a, G, ws->o, T, H * D, HD_G, ws->z, zl, 1);
    pack_if(s, ws->z, zl, ws->yq, ws->yqs);
    if (cuda_core_reader(s, &ly->wo_b, NULL)) quant_rows_if(s, ws->z, T, zl);
    if (mma_takes(s, &ly->wo_b)) {
        dsv4_error e;
        const int fused = cu_mma_linear_post(s->st, &ly->wo_b, ws->yq, cu_mma_ld(zl), ws->yqs, cu_mma_lds(zl), T, ws->mix, ws->X,
                                             c->hc_mult, c->dim, s->official, s->cm->mma_stream, &e);
        if (fused > 0) return;
        if (fused < 0 && !s->rc) s->rc = dsv4_fail(s->err, DSV4_E_STATE, "cuda: %s", e.msg);   /* taken above: a bug */
    }
    linear_q(s, &ly->wo_b, ws->z, ws->yq, ws->yqs, ws->sub);
    cu_hc_post(s->st, s->official, ws->sub, ws->mix, ws->X, T, c->hc_mult, c->dim);
}

static void step_attention(step_ctx *s, const cu_layer *ly, int L) {
    const dsv4_config *c = &s->m->cfg;
    cu_workspace *ws = s->ws;
    const int T = s->T, d = c->dim, D = c->head_dim, H = c->n_heads, R = c->rope_dim;
    const int nI = c->index_n_heads, cI = c->index_head_dim;
    const float *freq = ly->ratio ? s->cm->rope_compress : s->cm->rope_window;
    const cu_seq_layer *sl = ws->sl + (int64_t)L * s->n_items;
    const int cw = (ly->ratio == 4 ? 2 : 1) * D;
    /* the compressors and weights_proj read xn (bf16 in OFFICIAL): packed once, and on tensor cores all in one launch
     * (each weight's rows have the bits of its own launch; a decode step's small weights wait on memory latency, not
     * on bandwidth, so five launches cost about five times one), on a branch beside the query path (their outputs
     * are read from cu_attn_prepare on). A weight the kernel does not take: all on CUDA cores, after the branch. */
    int on_tc = 0;
    cu_stream br = NULL;
    if (ly->ratio && xn_packed16(s)) {
        const cu_mma16_out outs[5] = { { &ly->comp.wkv, ws->ck, cw }, { &ly->comp.wgate, ws->cz, cw }, { &ly->icomp.wkv, ws->ick, 2 * cI },
                                       { &ly->icomp.wgate, ws->icz, 2 * cI }, { &ly->idx_weights_proj, ws->wi, nI, 1 } };
        br = branch_fork(s);
        on_tc = !cu_mma16_linear_multi(s->st, outs, ly->ratio == 4 ? 5 : 2, ws->xb, cu_mma16_ld(d), T, NULL);
        branch_end(s, br);
    }
    attn_project(s, ly, ly->ratio == 4);
    mark(s, ST_QKV);
    if (ly->ratio && !on_tc) {
        cu_linear(s->st, &ly->comp.wkv, ws->xn, T, d, ws->ck, cw);
        cu_linear(s->st, &ly->comp.wgate, ws->xn, T, d, ws->cz, cw);
    }
    if (ly->ratio == 4) {
        if (!on_tc) {
            cu_linear(s->st, &ly->icomp.wkv, ws->xn, T, d, ws->ick, 2 * cI);
            cu_linear(s->st, &ly->icomp.wgate, ws->xn, T, d, ws->icz, 2 * cI);
        }
        if (!on_tc) {
            cu_linear(s->st, &ly->idx_weights_proj, ws->xn, T, d, ws->wi, nI);
            round_if(s, ws->wi, (int64_t)T * nI);
        }   /* on tensor cores wi was rounded in the epilogue */
    }
    /* q and kv normalised and rotated, kv encoded into kvs, the compressors' and the indexer's token inputs: one
     * launch. One token per item (decode): the ring slot is written now, with the step's own row (cu_kernels.h) */
    branch_join(s);   /* cu_attn_prepare reads the compressors', weights_proj's and idx_wq_b's outputs */
    const int ring_now = T == s->n_items;
    const cu_prep prep = { .official = s->official, .T = T, .H = H, .D = D, .R = R, .eps = c->norm_eps, .q = ws->q, .kv = ws->kv,
                           .kv_norm = ly->kv_norm, .freq = freq, .pos = ws->pos, .lay = s->main, .kvs = ws->kvs, .ring = ring_now,
                           .ring_len = s->m->ring_len, .item_of = ws->item_of, .sl = sl, .ratio = ly->ratio, .cw = cw, .nI = nI,
                           .cI = cI, .cz = ws->cz, .icz = ws->icz, .qi = ws->qi, .wi = ws->wi, .ape = ly->comp.ape,
                           .iape = ly->icomp.ape };
    cu_attn_prepare(s->st, &prep);
    mark(s, ST_QKV);
    if (ly->ratio) {   /* both compressors in one launch; at one token per item their ring writes too */
        const cu_comp_jobs jobs = { { { s->main, 0, ly->ratio, cw, ws->ck, ws->cz, ly->comp.norm },
                                      { s->index, 1, 4, 2 * cI, ws->ick, ws->icz, ly->icomp.norm } }, ly->ratio == 4 ? 2 : 1 };
        cu_compress(s->st, s->official, &jobs, ws->pos, ws->item_of, ws->items, sl, freq, R, c->norm_eps, T, ring_now);
        if (!ring_now) cu_comp_ring_write(s->st, &jobs, ws->pos, ws->item_of, ws->items, sl, T);
    }
    if (ly->ratio == 4) {
        mark(s, ST_COMPRESS);
        const cu_index_ws iw = { s->cm->idx_mma_on, ws->idx_qc, ws->idx_qu, ws->idx_offgrid, ws->idx_split,
                                 cu_index_split_words(ws->idx_rows_cap),
                                 s->cm->idx_tiles_on && cu_index_tiles_pay(T, s->n_items) };   /* mma: in OFFICIAL steps only */
        if (cu_index_select(s->st, s->official, iw, s->index, ws->qi, ws->wi, ws->pos, ws->item_of, sl, T, nI, cI, c->index_topk,
                            s->idx_rows, ws->idx_rows_cap, ws->idx_scores, ws->sel, ws->n_sel) && !s->rc)
            s->rc = dsv4_fail(s->err, DSV4_E_UNSUPPORTED, "cuda: this GPU cannot give the indexer's scoring kernel its shared "
                              "memory (%d heads x %d columns)", nI, cI);
        mark(s, ST_INDEX);
    }
    mark(s, ST_COMPRESS);
    const int max_keys = c->window + (ly->ratio == 128 ? (int)s->hca_rows : ly->ratio == 4 ? c->index_topk : 0);
    const int att_flags = (s->cm->att_mma_on ? CU_ATT_MMA : 0) | (s->cm->att_dec_on ? 0 : CU_ATT_NO_DEC) |
                          (s->cm->att_fused_on ? 0 : CU_ATT_NO_FUSED) | (s->cm->att_dec_mma_on ? 0 : CU_ATT_NO_DEC_MMA);
    if (cu_attention(s->st, s->official, att_flags, s->main, ws->q, ws->kvs, ws->pos, ws->item_of, ws->items, sl, s->m->ring_len, c->window,
                     ly->ratio, ws->sel, ws->n_sel, c->index_topk, ly->attn_sink, freq, T, H, D, R, max_keys, ws->att, ws->att_floats,
                     ws->att_bar, ws->o) && !s->rc)
        s->rc = dsv4_fail(s->err, DSV4_E_STATE, "cuda: the attention of layer %d cannot take %d keys a query (scratch of %lld floats)",
                          L, max_keys, (long long)ws->att_floats);
    mark(s, ST_ATTEND);
    attn_output(s, ly);
    /* finally the window rings: every query above read the step's own keys from kvs */
    if (!ring_now) cu_ring_write(s->st, s->main, ws->kvs, ws->pos, ws->item_of, ws->items, sl, s->m->ring_len, T);
    mark(s, ST_OUTPUT);
}

/* The shared expert over the step's rows (moe.c expert): g/v [T][I] projected here. OFFICIAL: the routed experts
 * left the input rows packed in ws->xq when they ran on tensor cores (in_packed), else act-quantized in ws->x8. */
static void shared_expert(step_ctx *s, const cu_layer *ly, int in_packed) {
    const dsv4_config *c = &s->m->cfg;
    cu_workspace *ws = s->ws;
    const int T = s->T, d = c->dim, I = c->moe_inter;
    const float *xe = ws->xn;   /* with tensor cores, packed in ws->xq by step_hc_pre */
    if (s->official && cuda_core_reader(s, &ly->sw1, &ly->sw3)) {
        if (in_packed) cu_act_quant(s->st, ws->xn, d, ws->x8, d, T, d, 128, 0);
        xe = ws->x8;
    }
    linear_q_pair(s, &ly->sw1, ws->seg, &ly->sw3, ws->sev, xe, ws->xq, ws->xqs);
    if (s->official && mma_takes(s, &ly->sw2))
        cu_swiglu_pack(s->st, s->official, ws->seg, ws->sev, NULL, T, I, c->swiglu_limit, ws->yq, cu_mma_ld(I), ws->yqs, cu_mma_lds(I));
    else
        cu_swiglu(s->st, s->official, ws->seg, ws->sev, NULL, T, I, c->swiglu_limit);
    if (cuda_core_reader(s, &ly->sw2, NULL)) quant_rows_if(s, ws->seg, T, I);
    linear_q(s, &ly->sw2, ws->seg, ws->yq, ws->yqs, ws->ys);
}

static void step_moe(step_ctx *s, const cu_layer *ly, int L) {
    const dsv4_config *c = &s->m->cfg;
    cu_workspace *ws = s->ws;
    const int T = s->T, d = c->dim, E = c->n_routed, K = c->n_act, tiles = moe_max_tiles(c, T);
    cu_moe_bufs b = { ws->xn, ws->x8, ws->route_e, ws->route_w, ws->plan, ws->eg, ws->ev, ws->ey,
                      s->mma, ws->xq, ws->egq, ws->xqs, ws->egqs, s->mma /* step_hc_pre packed xn */,
                      s->cm->mma_stream, 0 /* plan_ready: set by the routing below */ };
    /* experts in host memory (cuda_host_experts.h): the host needs this layer's rows and routing first */
    cu_host_experts *hx = L >= 0 && s->cm->hx && ly == &s->cm->layers[L] && s->cm->hx->n_host[L] ? s->cm->hx : NULL;
    /* the shared expert on a branch beside the router and the routed experts (its outputs are its own, read by
     * cu_hc_post_moe), where its input rows are already packed (in_packed: tensor cores, so step_hc_pre packed them;
     * else it reads the routed experts' act_quant copy) and the routed experts stay on this GPU */
    const int in_packed = cu_moe_input_packed(&b, &ly->ex, s->official, d);
    cu_stream br = !hx && !(ly->ep && s->cm->ep) && in_packed ? branch_fork(s) : NULL;
    if (br) {
        shared_expert(s, ly, 1);
        branch_end(s, br);
    }
    linear16(s, xn_packed16(s), &ly->gate, 1, ws->xn, T, d, 0, ws->router, E, 0);   /* xn is bf16, packed by step_hc_pre */
    /* with the routed experts on this GPU, a small step's plan comes out of the router's launch (cu_route_plan) */
    const int32_t *hash = ly->hash_routed ? ly->tid2eid : NULL;
    if (ly->ep && s->cm->ep)
        cu_route(s->st, ws->router, ly->gate_bias, hash, ws->tok, T, E, K, c->route_scale, ws->route_e, ws->route_w);
    else
        b.plan_ready = cu_route_plan(s->st, ws->router, ly->gate_bias, hash, ws->tok, T, E, K, c->route_scale, ws->route_e, ws->route_w,
                                     &b.plan);
    if (L >= 0 && s->cm->route_counts && ly == &s->cm->layers[L])   /* main layers only (dsv4 profile) */
        cu_count_routes(s->st, ws->route_e, T, K, s->cm->route_counts + (int64_t)L * E);
    /* the token split: tiles of split experts without a pair of the GPU's become absent (their weights unread) */
    if (hx && hx->owner_d) {
        if (!b.plan_ready) cu_moe_plan_build(s->st, ws->route_e, ws->route_w, T, K, E, &b.plan);
        b.plan_ready = 1;
        cu_moe_split_tiles(s->st, &b.plan, ws->route_e, K, E, hx->owner_d + (int64_t)L * E, hx->map.split_pct, tiles);
    }
    mark(s, ST_ROUTE);
    if (hx && s->hx_ahead) cuda_hx_publish(hx, s->st, c, ws->xn, ws->route_e, ws->route_w, T, L);
    else if (hx && !s->rc && cuda_hx_fetch(hx, s->st, c, ws->xn, ws->route_e, ws->route_w, T))
        s->rc = dsv4_fail(s->err, DSV4_E_STATE, "CUDA error copying layer %d's routing to the host", L);
    if (ly->ep && s->cm->ep) {
        /* the routed experts over every GPU (cuda_ep.h); a failure of the transport ends the step */
        if (!s->rc) s->rc = cuda_ep_routed(s->cm->ep, s->cm, c, s->official, L, T, tiles, &b, s->err);
    } else {
        dsv4_error e;
        if (cu_moe_routed(s->st, c, s->official, &ly->ex, T, tiles, &b, &e) && !s->rc)
            s->rc = dsv4_fail(s->err, DSV4_E_STATE, "cuda: layer %d's routed experts: %s", L, e.msg);
    }
    mark(s, ST_EXPERTS);
    /* the shared expert sees the same (OFFICIAL: quantized) rows as the routed ones */
    if (!br) shared_expert(s, ly, in_packed);
    /* the GPU has its experts and the shared expert queued: the host computes its experts meanwhile (enqueued
     * ahead: the server thread, cuda_hx_serve_start, the GPU waiting here for its rows) */
    if (hx && s->hx_ahead) cuda_hx_await(hx, s->st, c, T, L, ws->ey);
    else if (hx && !s->rc) s->rc = cuda_hx_compute(hx, s->m, L, s->st, T, ws->ey, s->err);
    /* the experts' sum and mHC's post in one launch: step_moe ends the sub-layer */
    branch_join(s);
    cu_hc_post_moe(s->st, s->official, ws->ey, ws->ys, ws->plan.token_pairs, K, ws->mix, ws->X, T, c->hc_mult, d);
    mark(s, ST_SHARED);
}

static void step_block(step_ctx *s, const cu_layer *ly, int L) {
    step_hc_pre(s, &ly->hc_attn, ly->attn_norm);
    mark(s, ST_MHC);
    step_attention(s, ly, L);   /* ends with hc_post */
    step_hc_pre(s, &ly->hc_ffn, ly->ffn_norm);
    mark(s, ST_MHC);
    step_moe(s, ly, L);   /* ends with hc_post */
    mark(s, ST_MHC);
}

/* ---- host side ------------------------------------------------------------------------------------------------ */

/* The step's metadata, laid out on the host and uploaded in one go per array. */
static int upload_meta(step_ctx *s, dsv4_step_item *items, dsv4_error *err) {
    struct dsv4_model *m = s->m;
    cu_workspace *ws = s->ws;
    const int T = s->T, n = s->n_items, NL = m->cfg.n_layers;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *item_of = malloc(sizeof(int32_t) * (size_t)T);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)T);
    cu_item *it = malloc(sizeof(cu_item) * (size_t)n);
    cu_seq_layer *sl = calloc((size_t)NL * (size_t)n, sizeof(cu_seq_layer));
    int rc = 0;
    if (!tok || !item_of || !pos || !it || !sl) {
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0, t = 0; i < n; i++) {
        const dsv4_seq *q = items[i].seq;
        it[i] = (cu_item){ t, items[i].n_tokens, q->pos };
        for (int k = 0; k < items[i].n_tokens; k++, t++) {
            tok[t] = items[i].tokens[k];
            pos[t] = q->pos + k;
            item_of[t] = i;
        }
        for (int L = 0; L < NL; L++) {
            const dsv4_layer_state *ls = &q->layer[L];
            cu_seq_layer *d = &sl[(int64_t)L * n + i];
            d->ring = ls->ring;
            d->ckv = ls->comp.kv;
            d->cscore = ls->comp.score;
            d->chist = ls->comp.hist_len;
            d->ikv = ls->icomp.kv;
            d->iscore = ls->icomp.score;
            d->ihist = ls->icomp.hist_len;
            d->crows = ls->crows.data;
            d->irows = ls->irows.data;
        }
    }
    if (cu_upload(ws->tok, tok, sizeof(int32_t) * (size_t)T) || cu_upload(ws->item_of, item_of, sizeof(int32_t) * (size_t)T) ||
        cu_upload(ws->pos, pos, sizeof(int64_t) * (size_t)T) || cu_upload(ws->items, it, sizeof(cu_item) * (size_t)n) ||
        cu_upload(ws->sl, sl, sizeof(cu_seq_layer) * (size_t)NL * (size_t)n))
        rc = dsv4_fail(err, DSV4_E_STATE, "cuda: uploading the step's metadata failed");
done:
    free(tok); free(item_of); free(pos); free(it); free(sl);
    return rc;
}

/* The LM head's plan: logits for every row that wants them, CU_HEAD_ROWS rows per pass of the head (spec
 * §12), and the tokens of the items that sample (their last row, drawn by cu_sample: only the ids come back, and
 * the rows that were asked for). Laid out and uploaded before the step's first launch, so that the first pass's
 * kernels follow the layers in the step's launch sequence (and its last graph) with no upload in between. */
typedef struct {
    int R, Q;                  /* rows through the head, requests drawn */
    int32_t *rows;             /* [R] the step's row of head row r */
    float **dst;               /* [R] where row r's logits go, or NULL */
    int *req_of;               /* [R] the request drawn from row r, or -1 */
    int *item_of_req;          /* [Q] */
} head_plan;

static void head_plan_free(head_plan *h) {
    free(h->rows);
    free(h->dst);
    free(h->req_of);
    free(h->item_of_req);
    memset(h, 0, sizeof *h);
}

static int head_prepare(step_ctx *s, dsv4_step_item *items, head_plan *h, dsv4_error *err) {
    const int V = s->m->cfg.vocab_size;
    int R = 0, Q = 0;
    memset(h, 0, sizeof *h);
    for (int i = 0; i < s->n_items; i++) {
        const dsv4_step_item *it = &items[i];
        R += it->want == DSV4_LOGITS_ALL ? it->n_tokens : it->want == DSV4_LOGITS_LAST || it->sample ? 1 : 0;
        Q += it->sample != NULL;
    }
    if (!R) return 0;
    h->R = R;
    h->Q = Q;
    h->rows = malloc(sizeof(int32_t) * (size_t)R);
    h->dst = malloc(sizeof(float *) * (size_t)R);
    h->req_of = malloc(sizeof(int) * (size_t)R);
    h->item_of_req = malloc(sizeof(int) * (size_t)(Q ? Q : 1));
    cu_sample_req *req = malloc(sizeof(cu_sample_req) * (size_t)(Q ? Q : 1));
    int rc = 0;
    if (!h->rows || !h->dst || !h->req_of || !h->item_of_req || !req) {
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0, r = 0, f = 0, q = 0; i < s->n_items; f += items[i].n_tokens, i++) {
        const dsv4_step_item *it = &items[i];
        const int k0 = it->want == DSV4_LOGITS_ALL ? 0 : it->want == DSV4_LOGITS_LAST || it->sample ? it->n_tokens - 1 : it->n_tokens;
        for (int k = k0; k < it->n_tokens; k++, r++) {
            h->rows[r] = f + k;
            h->dst[r] = it->want == DSV4_LOGITS_NONE ? NULL : it->logits + (int64_t)(it->want == DSV4_LOGITS_ALL ? k : 0) * V;
            h->req_of[r] = -1;
            if (it->sample && k == it->n_tokens - 1) {
                const dsv4_sampling *p = it->sample;
                req[q] = (cu_sample_req){ r % CU_HEAD_ROWS, p->top_k, p->n_allowed, p->temperature, p->top_p, p->min_p, p->seed, it->draw };
                h->item_of_req[q] = i;
                h->req_of[r] = q++;
            }
        }
    }
    if (cu_upload(s->ws->head_rows, h->rows, sizeof(int32_t) * (size_t)R) ||
        cu_upload(s->ws->sample_req, req, sizeof(cu_sample_req) * (size_t)Q))
        rc = dsv4_fail(err, DSV4_E_STATE, "cuda: upload failed");
done:
    free(req);
    if (rc) head_plan_free(h);
    return rc;
}

/* The kernels of the head's pass over plan rows r0 .. r0 + CU_HEAD_ROWS - 1 (logits into ws->logits, draws into
 * ws->sample_tok). No host wait: the first pass is part of the step's launch sequence. */
static void head_launch(step_ctx *s, const head_plan *h, int r0, const cu_hc *hc_head, const float *norm) {
    const dsv4_config *c = &s->m->cfg;
    cu_workspace *ws = s->ws;
    const int V = c->vocab_size;
    if (r0 >= h->R) return;
    const int n = h->R - r0 < CU_HEAD_ROWS ? h->R - r0 : CU_HEAD_ROWS;
    cu_hc_head(s->st, s->official, ws->X, ws->head_rows + r0, n, hc_head->fn.data, hc_head->base, hc_head->scale, c->hc_mult,
               c->dim, c->hc_eps, c->norm_eps, ws->head_x);
    cu_rmsnorm(s->st, s->official, ws->head_x, c->dim, norm, c->dim, c->norm_eps, ws->head_x, c->dim, n);
    linear16(s, pack16_if(s, ws->head_x, n, c->dim), &s->cm->head, 1, ws->head_x, n, c->dim, 0, ws->logits, V, 0);   /* bf16 rows */
    /* the pass's requests are consecutive (rows and requests go in item order) */
    int q0 = -1, q1 = -1;
    for (int k = 0; k < n; k++)
        if (h->req_of[r0 + k] >= 0) {
            if (q0 < 0) q0 = h->req_of[r0 + k];
            q1 = h->req_of[r0 + k] + 1;
        }
    if (q0 >= 0) cu_sample(s->st, ws->logits, V, ws->sample_req + q0, q1 - q0, ws->sample_w, ws->sample_tok + q0, NULL);
}

/* After the step's launches (the head's first pass among them) have finished: each pass's logits back, the
 * later passes launched and waited for in turn, then the drawn tokens. */
static int head_collect(step_ctx *s, dsv4_step_item *items, const head_plan *h, const cu_hc *hc_head, const float *norm,
                        dsv4_error *err) {
    const int V = s->m->cfg.vocab_size;
    cu_workspace *ws = s->ws;
    int rc = 0;
    for (int r0 = 0; r0 < h->R && !rc; r0 += CU_HEAD_ROWS) {
        const int n = h->R - r0 < CU_HEAD_ROWS ? h->R - r0 : CU_HEAD_ROWS;
        if (r0 > 0) head_launch(s, h, r0, hc_head, norm);
        if ((rc = cu_finish(s->st, "the LM head", err))) break;
        for (int k = 0; k < n; k++)
            if (h->dst[r0 + k] && cu_download(h->dst[r0 + k], ws->logits + (int64_t)k * V, sizeof(float) * (size_t)V)) {
                rc = dsv4_fail(err, DSV4_E_STATE, "cuda: copying logits back failed");
                break;
            }
    }
    if (!rc && h->Q) {
        int32_t *tok = malloc(sizeof(int32_t) * (size_t)h->Q);
        if (!tok) rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        else if (cu_download(tok, ws->sample_tok, sizeof(int32_t) * (size_t)h->Q))
            rc = dsv4_fail(err, DSV4_E_STATE, "cuda: copying sampled tokens back failed");
        for (int q = 0; !rc && q < h->Q; q++) *items[h->item_of_req[q]].token = tok[q];
        free(tok);
    }
    return rc;
}

/* DSpark features after target layer L, for the items that asked (into ws->feat, copied back at the end). */
static void capture_features(step_ctx *s, dsv4_step_item *items, int L) {
    const dsv4_config *c = &s->m->cfg;
    int k = -1, want = 0;
    for (int j = 0; j < c->n_dspark_targets; j++)
        if (c->dspark_target_layers[j] == L) k = j;
    for (int i = 0; i < s->n_items; i++) want |= items[i].features != NULL;
    if (k >= 0 && want) cu_features(s->st, s->official, s->ws->X, s->T, c->hc_mult, c->dim, c->n_dspark_targets, k, s->ws->feat);
}

static int copy_back_rows(step_ctx *s, dsv4_step_item *items, dsv4_error *err) {
    const dsv4_config *c = &s->m->cfg;
    const int64_t hcd = (int64_t)c->hc_mult * c->dim, fd = (int64_t)c->n_dspark_targets * c->dim;
    for (int i = 0, f = 0; i < s->n_items; f += items[i].n_tokens, i++) {
        const dsv4_step_item *it = &items[i];
        if (it->hidden && cu_download(it->hidden, s->ws->X + f * hcd, sizeof(float) * (size_t)(it->n_tokens * hcd)))
            return dsv4_fail(err, DSV4_E_STATE, "cuda: copying hidden rows back failed");
        if (it->features && cu_download(it->features, s->ws->feat + f * fd, sizeof(float) * (size_t)(it->n_tokens * fd)))
            return dsv4_fail(err, DSV4_E_STATE, "cuda: copying features back failed");
    }
    return 0;
}

/* Everything before the first launch: validation, the kernels' limits, scratch, the sequences' reservations,
 * the metadata upload. Nothing changes on error. */
static int step_begin(struct dsv4_model *m, dsv4_step_item *items, int n_items, step_ctx *s, dsv4_error *err) {
    struct cuda_model *cm = m->cuda;
    const dsv4_config *c = &m->cfg;
    int T = 0;
    int64_t max_rows = 0;
    if (cm->prof.on) {
        cu_finish(cm->st, "profile", NULL);
        cm->prof.t_last = cpu_profile_now_ms();
    }
    cu_use(cm->gpu);   /* steps may come from any thread */
    int rc = step_validate(m, m->state_mem, items, n_items, &T, &max_rows, err);
    if (rc) return rc;
    *s = (step_ctx){ m, cm, &cm->ws, cm->st, T, n_items, m->mode == DSV4_MODE_OFFICIAL, { 0 }, { 0 }, 0, 0, 0, err };
    s->mma = s->official && cm->mma_on;
    for (int i = 0; i < n_items; i++) {
        const int64_t end = items[i].seq->pos + items[i].n_tokens;
        if (end / 4 > s->idx_rows) s->idx_rows = end / 4;
        if (end / 128 > s->hca_rows) s->hca_rows = end / 128;
    }
    int has128 = 0;
    for (int L = 0; L < c->n_layers; L++) has128 |= c->compress_ratio[L] == 128;
    const int64_t keys = c->window + (has128 && s->hca_rows > c->index_topk ? s->hca_rows : c->index_topk);
    if (keys > cm->key_limit)
        return dsv4_fail(err, DSV4_E_RANGE, "cuda: a query would attend to %lld keys, the CUDA attention takes at most %d "
                         "(context too long for the CUDA backend)", (long long)keys, cm->key_limit);
    if ((rc = ws_ensure(m, T, n_items, s->idx_rows, keys, err))) return rc;
    if (cm->ep) {
        rc = cuda_ep_reserve(cm->ep, c, T, err);
        cu_use(cm->gpu);
        if (rc) return rc;
    }
    if (cm->hx && (rc = cuda_hx_reserve(cm->hx, c, T, err))) return rc;
    for (int i = 0; i < n_items; i++)
        if (seq_reserve(items[i].seq, items[i].n_tokens)) {
            size_t fb = 0, tb = 0;
            cu_mem_info(&fb, &tb);
            return dsv4_fail(err, DSV4_E_NOMEM, "out of GPU memory growing the state of step item %d (%.2f GiB free)", i,
                             fb / 1073741824.0);
        }
    kv_layout lm, li;
    kv_layout_init(&lm, m->kv_format, KV_ROW_MAIN, c->head_dim, c->rope_dim);
    kv_layout_init(&li, m->kv_format, KV_ROW_INDEX, c->index_head_dim, 0);
    s->main = lay_of(&lm);
    s->index = lay_of(&li);
    if ((rc = upload_meta(s, items, err))) return rc;
    mark(s, ST_HOST);
    return 0;
}

/* After the step's launches (the head's first pass the last of them): wait, the logits and drawn tokens back
 * (hp), hidden rows and features back, then the host's bookkeeping (history, position and, for the backbone,
 * the row counts). */
static int step_end(step_ctx *s, dsv4_step_item *items, const head_plan *hp, const cu_hc *hc_head, const float *norm, int backbone,
                    dsv4_error *err) {
    int rc;
    if (s->rc) return s->rc;
    if ((rc = cu_finish(s->st, "the step", err))) return rc;
    if (s->hx_ahead && (rc = cuda_hx_check(s->cm->hx, err))) return rc;
    if (s->ws->idx_offgrid && *s->ws->idx_offgrid) {   /* k_indexer.cu: tensor-core scores of data off the FP4 grid */
        const unsigned bits = *s->ws->idx_offgrid;
        *s->ws->idx_offgrid = 0;
        return dsv4_fail(err, DSV4_E_STATE, "cuda: the indexer's %s values are not FP4-simulated, so its tensor-core scores "
                         "are not exact (DSV4_CUDA_IDX_MMA=0 scores them in fp32)", bits & 1 ? "query" : "row");
    }
    if ((rc = head_collect(s, items, hp, hc_head, norm, err))) return rc;
    mark(s, ST_HEAD);
    if ((rc = copy_back_rows(s, items, err))) return rc;
    for (int i = 0; i < s->n_items; i++) {
        dsv4_seq *q = items[i].seq;
        memcpy(q->tokens + q->pos, items[i].tokens, sizeof(int32_t) * (size_t)items[i].n_tokens);
        q->pos += items[i].n_tokens;
        for (int L = 0; backbone && L < q->n_layers; L++) {
            dsv4_layer_state *ls = &q->layer[L];
            if (ls->comp.kv) ls->crows.n = q->pos / ls->comp.ratio;
            if (ls->icomp.kv) ls->irows.n = q->pos / ls->icomp.ratio;
        }
    }
    mark(s, ST_HOST);
    s->cm->prof.steps += s->cm->prof.on;
    return 0;
}

/* ---- the step as CUDA graphs (cu_graph.h) ---------------------------------------------------------------------
 * The captured region of a step is its whole launch sequence: cu_embed, every layer (and the DSpark features of
 * its target layers), the LM head's first pass. Everything that waits for the GPU or copies synchronously
 * (validation, scratch, reservations, the metadata and head-plan uploads) is done before it, in step_begin and
 * head_prepare; the first wait is step_end's cu_finish. The region is cut into segments, each captured and
 * launched as one graph, so that the host captures the next segment while the GPU runs the last one: the
 * first segment is the embedding and layer 0 alone (all the GPU waits for before its first kernel), then
 * CU_GRAPH_LAYERS layers each, the last with the head. Steps launched directly instead (graphs_usable): graphs turned off (DSV4_CUDA_GRAPHS=0 at
 * load, cuda_graphs_set), experts over several GPUs (cuda_ep.c: the transport waits on the host), the per-stage
 * profiler (it waits at every stage), the MTP and DSpark heads (cuda_mtp_forward, the dspark calls: a few launches
 * each), and steps whose routed experts the host computes (host work and waits mid-step), except those enqueued
 * ahead. Experts in host memory that the GPU reads over the bus are ordinary launches. By default
 * (DSV4_CUDA_HX_AHEAD; 0: launched directly) a step of at most CU_HX_AHEAD_MAX_T tokens with host experts is enqueued
 * ahead (hx_ahead: every hand-off a pair of kernels, cuda_host_experts.h), graphed: a thread of the host serves its
 * layers as the GPU hands them over. With graphs off (not the profiler's, which waits at every stage) such a step is
 * enqueued ahead launched directly: the GPU then waits at each hand-off while this thread may still launch, behind a
 * launch queue that may fill and stall it, and the server keeps the host's side going all the while
 * (test_gpu_host_experts; the variant that tells what the graphs change in a step enqueued ahead). */
#define CU_GRAPH_LAYERS 4

/* Nothing in the step waits on the host mid-way: no expert transport over GPUs, no per-stage profiler. */
static int step_unbroken(const struct cuda_model *cm) { return !cm->ep && !cm->prof.on; }
static int graphs_free(const struct cuda_model *cm) { return cm->graphs_on && cm->graphs && step_unbroken(cm); }
static int hx_ahead_usable(const struct cuda_model *cm, int T) {
    return cm->hx && cuda_hx_hands_off(cm->hx) && cm->hx_ahead_on && T <= CU_HX_AHEAD_MAX_T && step_unbroken(cm);
}
static int graphs_usable(const struct cuda_model *cm, int T) {
    return graphs_free(cm) && (!(cm->hx && cuda_hx_hands_off(cm->hx)) || hx_ahead_usable(cm, T));
}

/* Segments of a graphed step of NL layers, and the first layer of segment k (NL for k = the count). */
static int seg_count(int NL) { return NL <= 1 ? 1 : 1 + (NL - 1 + CU_GRAPH_LAYERS - 1) / CU_GRAPH_LAYERS; }
static int seg_start(int k, int NL) {
    const int L = k == 0 ? 0 : 1 + (k - 1) * CU_GRAPH_LAYERS;
    return L < NL ? L : NL;
}

int cuda_step(struct dsv4_model *m, dsv4_step_item *items, int n_items, dsv4_error *err) {
    struct cuda_model *cm = m->cuda;
    const dsv4_config *c = &m->cfg;
    const int NL = c->n_layers;
    step_ctx s;
    head_plan hp;
    int rc = step_begin(m, items, n_items, &s, err);
    if (rc) return rc;
    if ((rc = head_prepare(&s, items, &hp, err))) return rc;
    /* one segment of all the layers when launched directly */
    const int graphed = graphs_usable(cm, s.T), n_seg = graphed ? seg_count(NL) : 1;
    s.hx_ahead = hx_ahead_usable(cm, s.T);
    /* the head's kernels depend on how many rows it takes and whether it draws: part of the shape */
    const int slot = graphed ? cu_graphs_slot(cm->graphs, s.T, n_items, 2 * hp.R + (hp.Q > 0), n_seg) : -1;
    if (graphed && slot < 0) {
        head_plan_free(&hp);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    /* enqueued ahead: the host's experts are served by a thread of their own from now on, layer by layer as the GPU
     * hands them over, while this thread enqueues (cuda_host_experts.h: some of the enqueue's calls may wait for the
     * GPU, which waits for the host at the first hand-off) */
    if (s.hx_ahead && (rc = cuda_hx_serve_start(cm->hx, m, s.st, s.T, err))) {
        head_plan_free(&hp);
        return rc;
    }
    /* From here on the sequences change. */
    if (cm->route_counts) m->counted_tokens += (uint64_t)s.T;
    const double t_submit = cpu_profile_now_ms();
    for (int k = 0; k < n_seg; k++) {
#ifdef DIAG_REPLAY
        /* a measuring build (tools/gpu/stage_replay.sh), never a real one: a segment captured before is launched
         * again with its old arguments (positions and sizes of an earlier step): the GPU's time without the host's
         * captures. Its results are wrong. */
        if (graphed && !cu_graph_relaunch(cm->graphs, slot, k, s.st)) continue;
#endif
        if (graphed && (rc = cu_graph_begin(cm->graphs, s.st, err))) break;
        if (k == 0) {
            cu_embed(s.st, &cm->embed, s.ws->tok, s.T, c->hc_mult, c->dim, s.ws->X);
            mark(&s, ST_EMBED);
        }
        const int L1 = k == n_seg - 1 ? NL : seg_start(k + 1, NL);
        for (int L = graphed ? seg_start(k, NL) : 0; L < L1; L++) {
            step_block(&s, &cm->layers[L], L);
            capture_features(&s, items, L);
        }
        if (k == n_seg - 1) {
            head_launch(&s, &hp, 0, &cm->hc_head, cm->norm);
            mark(&s, ST_HEAD);
        }
        branch_join(&s);   /* never pending here (each sub-layer joins its branches); a capture must end joined */
        /* a failure inside the sequence (s.rc) drops the capture: step_end reports it */
        if (graphed && ((rc = cu_graph_end(cm->graphs, slot, k, s.st, s.rc != 0, err)) || s.rc)) break;
    }
    const double t_wait = cpu_profile_now_ms();
    /* enqueued ahead: the server joined (on a failure of the enqueue, stopped, and the layers waiting released) */
    if (s.hx_ahead) rc = cuda_hx_serve_finish(cm->hx, s.st, rc ? rc : s.rc, err);
    if (!rc) rc = step_end(&s, items, &hp, &cm->hc_head, cm->norm, 1, err);
    head_plan_free(&hp);
    if (cm->graphs && !rc) {
        cu_graph_counts *n = cu_graphs_counts(cm->graphs);
        if (graphed) {
            n->graphed_steps++;
            n->host_ms.submit += t_wait - t_submit;
            n->host_ms.wait += cpu_profile_now_ms() - t_wait;
        } else n->direct_steps++;
    }
    return rc;
}

/* The V4 MTP head on the GPU (core/mtp.c, the same order of operations): X' = bf16(e_proj(rmsnorm(embed[next],
 * enorm)) + h_proj(rmsnorm(X_s, hnorm))) on every stream s, the MTP block on layer 0 of the MTP state, the MTP's
 * own head collapse and norm before the shared LM head. */
int cuda_mtp_forward(struct dsv4_model *m, dsv4_seq *state, const float *X, const int32_t *next_tokens, int n,
                     dsv4_logits_want want, float *logits, dsv4_error *err) {
    struct cuda_model *cm = m->cuda;
    const dsv4_config *c = &m->cfg;
    if (!cm->mtp.block) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "this checkpoint has no V4 MTP head (mtp.0.e_proj)");
    if (!X) return dsv4_fail(err, DSV4_E_ARG, "MTP: missing target hidden states");
    dsv4_step_item it = { state, next_tokens, n, want, logits, NULL };
    step_ctx s;
    int rc = step_begin(m, &it, 1, &s, err);
    if (rc) return dsv4_wrap(err, "MTP");
    cu_workspace *ws = s.ws;
    const int d = c->dim, hc = c->hc_mult, T = s.T;
    if (cu_upload(ws->mtp_h, X, sizeof(float) * (size_t)T * hc * d)) return dsv4_fail(err, DSV4_E_STATE, "MTP: upload failed");
    head_plan hp;   /* the MTP head is launched directly (cuda_step's comment says why) */
    if ((rc = head_prepare(&s, &it, &hp, err))) return dsv4_wrap(err, "MTP");
    cu_embed(s.st, &cm->embed, ws->tok, T, 1, d, ws->u);
    cu_rmsnorm(s.st, s.official, ws->u, d, cm->mtp.enorm, d, c->norm_eps, ws->u, d, T);
    cu_rmsnorm(s.st, s.official, ws->mtp_h, d, cm->mtp.hnorm, d, c->norm_eps, ws->mtp_h, d, T * hc);
    quant_rows_if(&s, ws->u, T, d);
    quant_rows_if(&s, ws->mtp_h, T * hc, d);
    cu_linear(s.st, &cm->mtp.e_proj, ws->u, T, d, ws->xn, d);
    cu_linear(s.st, &cm->mtp.h_proj, ws->mtp_h, T * hc, d, ws->mtp_out, d);
    round_if(&s, ws->xn, (int64_t)T * d);
    round_if(&s, ws->mtp_out, (int64_t)T * hc * d);
    cu_mtp_mix(s.st, s.official, ws->xn, ws->mtp_out, ws->X, T, hc, d);
    mark(&s, ST_EMBED);
    step_block(&s, cm->mtp.block, 0);
    head_launch(&s, &hp, 0, &cm->mtp.hc_head, cm->mtp.norm);
    mark(&s, ST_HEAD);
    rc = step_end(&s, &it, &hp, &cm->mtp.hc_head, cm->mtp.norm, 0, err);
    head_plan_free(&hp);
    return rc;
}
/* ---- DSpark (core/dspark.c, the same order of operations) ------------------------------------------------------- */

/* A step of T positions p0.. that belongs to no sequence (the DSpark block and context): scratch and metadata. */
static int positions_begin(struct dsv4_model *m, const int32_t *tok, int T, int64_t p0, step_ctx *s, dsv4_error *err) {
    struct cuda_model *cm = m->cuda;
    cu_use(cm->gpu);
    *s = (step_ctx){ m, cm, &cm->ws, cm->st, T, 1, m->mode == DSV4_MODE_OFFICIAL, { 0 }, { 0 }, 0, 0, 0, err };
    s->mma = s->official && cm->mma_on;
    int rc = ws_ensure(m, T, 1, 0, 0, err);
    if (rc) return rc;
    int32_t *t = malloc(sizeof(int32_t) * (size_t)T), *item = calloc((size_t)T, sizeof(int32_t));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)T);
    const cu_item it = { 0, T, p0 };
    if (t && item && pos) {
        for (int i = 0; i < T; i++) {
            t[i] = tok ? tok[i] : 0;
            pos[i] = p0 + i;
        }
        if (cu_upload(s->ws->tok, t, sizeof(int32_t) * (size_t)T) || cu_upload(s->ws->pos, pos, sizeof(int64_t) * (size_t)T) ||
            cu_upload(s->ws->item_of, item, sizeof(int32_t) * (size_t)T) || cu_upload(s->ws->items, &it, sizeof it))
            rc = dsv4_fail(err, DSV4_E_STATE, "cuda: uploading positions failed");
    } else {
        rc = dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    free(t); free(item); free(pos);
    return rc;
}

int cuda_dspark_commit(struct dsv4_model *m, float *ring, int64_t pos, const float *features, int n, dsv4_error *err) {
    struct cuda_model *cm = m->cuda;
    const dsv4_config *c = &m->cfg;
    const int d = c->dim, nt = c->n_dspark_targets, D = c->head_dim, W = c->window;
    step_ctx s;
    int rc = positions_begin(m, NULL, n, pos, &s, err);
    if (rc) return rc;
    cu_workspace *ws = s.ws;
    /* main_x = rmsnorm(main_proj(features), main_norm) */
    if (cu_upload(ws->feat, features, sizeof(float) * (size_t)n * nt * d)) return dsv4_fail(err, DSV4_E_STATE, "DSpark: upload failed");
    quant_rows_if(&s, ws->feat, n, nt * d);
    cu_linear(s.st, &cm->dspark.main_proj, ws->feat, n, nt * d, ws->xn, d);
    round_if(&s, ws->xn, (int64_t)n * d);
    cu_rmsnorm(s.st, s.official, ws->xn, d, cm->dspark.main_norm, d, c->norm_eps, ws->xn, d, n);
    /* each stage's context keys: its own wkv and kv_norm, RoPE at the committed position, into its ring */
    for (int st = 0; st < cm->dspark.n_stages; st++) {
        const cu_layer *ly = &cm->dspark.stages[st];
        const float *x = ws->xn;
        if (s.official) {
            cu_act_quant(s.st, ws->xn, d, ws->u, d, n, d, 128, 0);
            x = ws->u;
        }
        cu_linear(s.st, &ly->wkv, x, n, d, ws->kv, D);
        round_if(&s, ws->kv, (int64_t)n * D);
        const cu_prep prep = { .official = s.official, .T = n, .D = D, .R = c->rope_dim, .eps = c->norm_eps, .kv = ws->kv,
                               .kv_norm = ly->kv_norm, .freq = cm->rope_window, .pos = ws->pos };   /* the kv rows only */
        cu_attn_prepare(s.st, &prep);
        cu_dspark_ring_write(s.st, ws->kv, n, D, ring + (int64_t)st * W * D, pos, W);
    }
    return cu_finish(s.st, "the DSpark context", err);
}

/* The drafting block for ids [gamma] at pos: every stage, then the last stage's hc_head into ws->head_x (= y). */
static int dspark_stages(struct dsv4_model *m, const float *ring, int64_t pos, const int32_t *ids, int gamma, step_ctx *s,
                         dsv4_error *err) {
    struct cuda_model *cm = m->cuda;
    const dsv4_config *c = &m->cfg;
    const int d = c->dim, D = c->head_dim, W = c->window;
    if (gamma > CU_HEAD_ROWS) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "cuda: DSpark blocks of more than %d drafts", CU_HEAD_ROWS);
    int rc = positions_begin(m, ids, gamma, pos, s, err);
    if (rc) return rc;
    cu_workspace *ws = s->ws;
    cu_embed(s->st, &cm->embed, ws->tok, gamma, c->hc_mult, d, ws->X);
    for (int st = 0; st < cm->dspark.n_stages; st++) {
        const cu_layer *ly = &cm->dspark.stages[st];
        step_hc_pre(s, &ly->hc_attn, ly->attn_norm);
        attn_project(s, ly, 0);
        const cu_prep prep = { .official = s->official, .T = gamma, .H = c->n_heads, .D = D, .R = c->rope_dim, .eps = c->norm_eps,
                               .q = ws->q, .kv = ws->kv, .kv_norm = ly->kv_norm, .freq = cm->rope_window, .pos = ws->pos };
        cu_attn_prepare(s->st, &prep);   /* q and kv normalised and rotated; the stage's keys are in its ring */
        cu_dspark_attention(s->st, s->official, ws->q, ws->kv, ring + (int64_t)st * W * D, pos, gamma, W, ly->attn_sink, cm->rope_window,
                            c->n_heads, D, c->rope_dim, ws->o);
        attn_output(s, ly);   /* ends with hc_post */
        step_hc_pre(s, &ly->hc_ffn, ly->ffn_norm);
        step_moe(s, ly, -1);   /* DSpark stages keep all their experts on rank 0; ends with hc_post */
    }
    int32_t rows[CU_HEAD_ROWS];
    for (int j = 0; j < gamma; j++) rows[j] = j;
    if (cu_upload(ws->head_rows, rows, sizeof(int32_t) * (size_t)gamma)) return dsv4_fail(err, DSV4_E_STATE, "DSpark: upload failed");
    cu_hc_head(s->st, s->official, ws->X, ws->head_rows, gamma, cm->dspark.hc_head.fn.data, cm->dspark.hc_head.base,
               cm->dspark.hc_head.scale, c->hc_mult, d, c->hc_eps, c->norm_eps, ws->head_x);
    return 0;
}

int cuda_dspark_block(struct dsv4_model *m, const float *ring, int64_t pos, const int32_t *ids, int gamma, float *y, float *U,
                      dsv4_error *err) {
    struct cuda_model *cm = m->cuda;
    const dsv4_config *c = &m->cfg;
    const int d = c->dim, V = c->vocab_size;
    step_ctx s;
    int rc = dspark_stages(m, ring, pos, ids, gamma, &s, err);
    if (rc) return rc;
    cu_workspace *ws = s.ws;
    /* y = the last stage's hc_head (before the norm); U = head . rmsnorm(y, norm) */
    if ((rc = cu_finish(s.st, "the DSpark block", err))) return rc;
    if (cu_download(y, ws->head_x, sizeof(float) * (size_t)gamma * d)) return dsv4_fail(err, DSV4_E_STATE, "DSpark: download failed");
    cu_rmsnorm(s.st, s.official, ws->head_x, d, cm->dspark.norm, d, c->norm_eps, ws->head_x, d, gamma);
    cu_linear(s.st, &cm->head, ws->head_x, gamma, d, ws->logits, V);
    if ((rc = cu_finish(s.st, "the DSpark head", err))) return rc;
    if (cu_download(U, ws->logits, sizeof(float) * (size_t)gamma * V)) return dsv4_fail(err, DSV4_E_STATE, "DSpark: download failed");
    return 0;
}

/* A whole draft on the GPU (core/dspark.c dsv4_dspark_draft, the same order of operations): the block, U = head .
 * rmsnorm(y), then for j = 0 .. k-1 in turn: e = bf16(markov_w1[previous token]) (the previous draw read on the
 * device), U_j += markov_w2 . e, draft j = cu_sample(U_j) with draw number draw0 + j (and its distribution when
 * probs), z_j = confidence . [y_j ; e]. Only the ids, the confidence logits and what was asked for come back. */
int cuda_dspark_draft(struct dsv4_model *m, const float *ring, int64_t pos, const int32_t *ids, int gamma, int k,
                      const dsv4_sampling *sp, uint64_t draw0, int32_t *draft, float *conf, float *probs, float *U, dsv4_error *err) {
    struct cuda_model *cm = m->cuda;
    const dsv4_config *c = &m->cfg;
    const int d = c->dim, V = c->vocab_size, rank = c->dspark_markov_rank, dr = d + rank;
    if (k < 1 || k > gamma) return dsv4_fail(err, DSV4_E_ARG, "DSpark: %d drafts from a block of %d", k, gamma);
    step_ctx s;
    int rc = dspark_stages(m, ring, pos, ids, gamma, &s, err);
    if (rc) return rc;
    cu_workspace *ws = s.ws;
    cu_rmsnorm(s.st, s.official, ws->head_x, d, cm->dspark.norm, d, c->norm_eps, ws->xn, d, gamma);   /* y stays in head_x */
    cu_linear(s.st, &cm->head, ws->xn, gamma, d, ws->logits, V);
    cu_sample_req req[CU_HEAD_ROWS];
    for (int j = 0; j < k; j++)
        req[j] = (cu_sample_req){ 0, sp->top_k, sp->n_allowed, sp->temperature, sp->top_p, sp->min_p, sp->seed, draw0 + (uint64_t)j };
    if (cu_upload(ws->dsp_req, req, sizeof(cu_sample_req) * (size_t)k) || cu_upload(ws->dsp_ids, ids, sizeof(int32_t)))
        return dsv4_fail(err, DSV4_E_STATE, "DSpark: upload failed");
    float *markov = ws->sample_w + V;   /* row 1 of the sampler's scratch: each draw below uses row 0 */
    for (int j = 0; j < k; j++) {
        float *Uj = ws->logits + (int64_t)j * V;
        cu_dspark_markov_in(s.st, s.official, &cm->dspark.markov_w1, ws->dsp_ids, j, ws->head_x, d, rank, ws->dsp_cat);
        cu_linear(s.st, &cm->dspark.markov_w2, ws->dsp_cat + (int64_t)j * dr + d, 1, rank, markov, V);
        cu_add_row(s.st, Uj, markov, V);
        cu_sample(s.st, Uj, V, ws->dsp_req + j, 1, ws->sample_w, ws->dsp_ids + j + 1, probs ? ws->dsp_probs + (int64_t)j * V : NULL);
        cu_linear(s.st, &cm->dspark.confidence, ws->dsp_cat + (int64_t)j * dr, 1, dr, ws->dsp_z + j, 1);
    }
    if ((rc = cu_finish(s.st, "the DSpark heads", err))) return rc;
    if (cu_download(draft, ws->dsp_ids + 1, sizeof(int32_t) * (size_t)k) || (conf && cu_download(conf, ws->dsp_z, sizeof(float) * (size_t)k)) ||
        (probs && cu_download(probs, ws->dsp_probs, sizeof(float) * (size_t)k * V)) ||
        (U && cu_download(U, ws->logits, sizeof(float) * (size_t)k * V)))
        return dsv4_fail(err, DSV4_E_STATE, "DSpark: download failed");
    return 0;
}
#else
typedef int dsv4_cuda_step_unused; /* built only with CUDA=1 */
#endif
