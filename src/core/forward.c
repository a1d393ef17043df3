/* The one forward primitive (DESIGN §2): a ragged batch of (sequence, n new tokens) through every layer.
 * Linear layers and experts run over all tokens of the step at once (weights are read once per step);
 * attention, compressors and the indexer run per sequence against that sequence's own state. */
#include "backend/cpu/kernels.h"
#include "backend/cuda/cuda_backend.h"
#include "core/attention.h"
#include "core/hc.h"
#include "core/moe.h"
#include "core/norm.h"
#include "core/numerics.h"
#include "core/sample.h"
#include "core/workspace.h"
#include "core/forward.h"
#include "model/model.h"
#include "state/sequence.h"
#include "util/error.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dsv4_workspace_free(dsv4_workspace *ws) {
    if (!ws) return;
    void *bufs[] = {ws->batch.first, ws->batch.item_of, ws->batch.pos, ws->batch.tok, ws->X, ws->u, ws->xn,
                    ws->mixbuf, ws->mix, ws->sub, ws->qr, ws->q, ws->kv, ws->o, ws->z, ws->ck, ws->cz, ws->ick,
                    ws->icz, ws->qi, ws->wi, ws->sel, ws->n_sel, ws->pooled, ws->keyscratch, ws->idxscratch,
                    ws->heapscratch, (void *)ws->keyptrs, ws->router, ws->route_e, ws->route_w, ws->moe_first,
                    ws->pair_tok, ws->pair_w, ws->pair_x, ws->pair_g, ws->pair_v, ws->pair_y, ws->ex, ws->eg, ws->ev, ws->ey, ws->acc, (void *)ws->head_out, ws->sample_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    sample_scratch_free(&ws->sample);
    free(ws);
}

/* Grow one buffer; on failure the old one stays valid (and the whole ensure fails). */
static int grow(void **p, size_t bytes) {
    void *np = realloc(*p, bytes + 64);
    if (!np) return -1;
    *p = np;
    return 0;
}
#define GROW(ptr, count) \
    do { \
        if (grow((void **)&(ptr), sizeof(*(ptr)) * (size_t)(count))) return -1; \
    } while (0)

/* Size every per-token buffer for T tokens and the key scratch for max_rows compressed rows. */
int workspace_ensure(struct dsv4_model *m, int T, int64_t max_rows) {
    const dsv4_config *c = &m->cfg;
    if (!m->ws) {
        m->ws = calloc(1, sizeof(dsv4_workspace));
        if (!m->ws) return -1;
        m->ws->n_threads = dsv4_pool_threads(m->pool);
    }
    dsv4_workspace *ws = m->ws;
    const int nt = ws->n_threads;
    const int64_t d = c->dim, hc = c->hc_mult, D = c->head_dim, H = c->n_heads;
    if (T > ws->T_cap) {
        const int64_t cw = 2 * (D > c->index_head_dim ? D : c->index_head_dim);
        GROW(ws->batch.item_of, T); GROW(ws->batch.pos, T); GROW(ws->batch.tok, T);
        GROW(ws->X, T * hc * d); GROW(ws->u, T * d); GROW(ws->xn, T * d);
        GROW(ws->mixbuf, T * hc_mix_count(c->hc_mult)); GROW(ws->mix, T); GROW(ws->sub, T * d);
        GROW(ws->qr, T * c->q_lora); GROW(ws->q, T * H * D); GROW(ws->kv, T * D); GROW(ws->o, T * H * D);
        GROW(ws->z, T * c->o_groups * c->o_lora);
        GROW(ws->ck, T * 2 * D); GROW(ws->cz, T * 2 * D);
        GROW(ws->ick, T * 2 * c->index_head_dim); GROW(ws->icz, T * 2 * c->index_head_dim);
        GROW(ws->qi, T * c->index_n_heads * c->index_head_dim); GROW(ws->wi, T * c->index_n_heads);
        GROW(ws->sel, (int64_t)T * c->index_topk); GROW(ws->n_sel, T);
        GROW(ws->pooled, cw);
        GROW(ws->router, T * c->n_routed); GROW(ws->route_e, T * c->n_act); GROW(ws->route_w, T * c->n_act);
        const int64_t P = moe_pair_cap(T, c->n_act);
        GROW(ws->moe_first, c->n_routed + 1); GROW(ws->pair_tok, P); GROW(ws->pair_w, P);
        GROW(ws->pair_x, P * d); GROW(ws->pair_g, P * c->moe_inter); GROW(ws->pair_v, P * c->moe_inter);
        GROW(ws->pair_y, P * d);
        GROW(ws->ex, T * d); GROW(ws->eg, T * c->moe_inter); GROW(ws->ev, T * c->moe_inter); GROW(ws->ey, T * d);
        GROW(ws->acc, T * d); GROW(ws->head_out, T);
        GROW(ws->idxscratch, (int64_t)nt * c->index_topk); GROW(ws->heapscratch, (int64_t)nt * c->index_topk);
        ws->T_cap = T;
        ws->pair_cap = (int)P;
    }
    if (max_rows < c->index_topk) max_rows = c->index_topk;
    if (max_rows > ws->rows_cap || !ws->keyscratch) {
        int64_t cap = ws->rows_cap ? ws->rows_cap : 64;
        while (cap < max_rows) cap *= 2;
        GROW(ws->keyscratch, nt * ATT_GROUP * (c->window + cap));
        GROW(ws->keyptrs, nt * (c->window + cap));
        ws->rows_cap = cap;
    }
    return 0;
}

/* Validate the whole step before touching any state, so that an error leaves every sequence as it was. Both
 * backends run this: the same inputs give the same errors on every device. */
int step_validate(struct dsv4_model *m, const seq_mem *mem, dsv4_step_item *items, int n_items, int *T_out,
                  int64_t *max_rows, dsv4_error *err) {
    const dsv4_config *c = &m->cfg;
    int64_t T = 0, rows = 0;
    if (n_items <= 0 || !items) return dsv4_fail(err, DSV4_E_ARG, "a step needs at least one item");
    for (int i = 0; i < n_items; i++) {
        const dsv4_step_item *it = &items[i];
        if (!it->seq) return dsv4_fail(err, DSV4_E_ARG, "step item %d has no sequence", i);
        if (it->seq->model != m) return dsv4_fail(err, DSV4_E_ARG, "step item %d: the sequence belongs to another model", i);
        if (it->seq->mem != mem)
            return dsv4_fail(err, DSV4_E_ARG, "step item %d: the sequence keeps its state in %s memory, this step runs on %s",
                             i, it->seq->mem->name, mem->name);
        for (int j = 0; j < i; j++)
            if (items[j].seq == it->seq) return dsv4_fail(err, DSV4_E_ARG, "a sequence appears twice in one step (items %d and %d)", j, i);
        if (it->n_tokens <= 0 || !it->tokens) return dsv4_fail(err, DSV4_E_ARG, "step item %d has no tokens", i);
        if (it->want != DSV4_LOGITS_NONE && !it->logits) return dsv4_fail(err, DSV4_E_ARG, "step item %d wants logits but gives no buffer", i);
        if (it->sample && !it->token)
            return dsv4_fail(err, DSV4_E_ARG, "step item %d asks for a sampled token but gives no place for it", i);
        if (it->sample && sample_check(it->sample, err)) return dsv4_wrap(err, "step item %d", i);
        for (int k = 0; k < it->n_tokens; k++)
            if (it->tokens[k] < 0 || it->tokens[k] >= c->vocab_size)
                return dsv4_fail(err, DSV4_E_ARG, "token id %d at index %d is outside the vocabulary (0..%d)",
                                 it->tokens[k], k, c->vocab_size - 1);
        const int64_t end = it->seq->pos + it->n_tokens;
        if (end > c->max_position)
            return dsv4_fail(err, DSV4_E_RANGE, "context overflow: position %lld exceeds the model's maximum of %lld tokens",
                             (long long)end, (long long)c->max_position);
        T += it->n_tokens;
        if (T > (1 << 24)) return dsv4_fail(err, DSV4_E_ARG, "too many tokens in one step");
        if (end / 4 + 1 > rows) rows = end / 4 + 1;
    }
    *T_out = (int)T;
    *max_rows = rows;
    return 0;
}

static void embed_tokens(struct dsv4_model *m, dsv4_workspace *ws) {
    const int d = m->cfg.dim, hc = m->cfg.hc_mult;
    for (int t = 0; t < ws->batch.T; t++) {
        float *x = ws->X + (int64_t)t * hc * d;
        weight_decode_row(&m->embed, ws->batch.tok[t], x);
        for (int i = 1; i < hc; i++) memcpy(x + (int64_t)i * d, x, sizeof(float) * (size_t)d);
    }
}

/* xn[t] = rmsnorm(u[t]) with weight w for every token of the step, tokens spread over the pool (a token's norm is
 * computed by the same code whichever thread takes it). */
typedef struct {
    const struct dsv4_model *m;
    const float *w;
    dsv4_workspace *ws;
} norm_job;

static void norm_tokens(void *ctx, int t0, int t1, int thread) {
    (void)thread;
    const norm_job *j = ctx;
    const int d = j->m->cfg.dim;
    for (int t = t0; t < t1; t++)
        rmsnorm(j->m->mode, j->ws->u + (int64_t)t * d, j->w, d, j->m->cfg.norm_eps, j->ws->xn + (int64_t)t * d);
}

static void norm_step(struct dsv4_model *m, const float *w, dsv4_workspace *ws) {
    norm_job j = { m, w, ws };
    dsv4_pool_run(m->pool, ws->batch.T, norm_tokens, &j);
}

void block_forward_with(struct dsv4_model *m, const dsv4_layer *ly, block_attention_fn attend, void *ctx,
                        dsv4_workspace *ws) {
    const dsv4_config *c = &m->cfg;
    const int T = ws->batch.T;
    hc_pre(m->pool, m->mode, c, &ly->hc_attn, ws->X, T, ws->u, ws->mix, ws->mixbuf);
    norm_step(m, ly->attn_norm, ws);
    cpu_profile_mark(&m->prof, CP_MHC);
    attend(m, ly, ctx, ws);
    hc_post(m->pool, m->mode, c, ws->sub, ws->mix, ws->X, T);
    hc_pre(m->pool, m->mode, c, &ly->hc_ffn, ws->X, T, ws->u, ws->mix, ws->mixbuf);
    norm_step(m, ly->ffn_norm, ws);
    cpu_profile_mark(&m->prof, CP_MHC);
    moe_forward(m, ly, ws);
    hc_post(m->pool, m->mode, c, ws->sub, ws->mix, ws->X, T);
    cpu_profile_mark(&m->prof, CP_MHC);
}

static void sequence_attention(struct dsv4_model *m, const dsv4_layer *ly, void *ctx, dsv4_workspace *ws) {
    attention_forward(m, ly, *(const int *)ctx, ws);
}

void block_forward(struct dsv4_model *m, const dsv4_layer *ly, int L, dsv4_workspace *ws) {
    block_forward_with(m, ly, sequence_attention, &L, ws);
}

/* Items that sample without wanting logits still need their last row: a host row each, and the sampler's
 * scratch. */
static int sample_rows_ensure(struct dsv4_model *m, const dsv4_step_item *items, int n_items) {
    dsv4_workspace *ws = m->ws;
    const int V = m->cfg.vocab_size;
    int n = 0, any = 0;
    for (int i = 0; i < n_items; i++) {
        any |= items[i].sample != NULL;
        n += items[i].sample && items[i].want == DSV4_LOGITS_NONE;
    }
    if (any && !ws->sample.vocab && sample_scratch_init(&ws->sample, V)) return -1;
    if (n > ws->sample_rows_cap) {
        GROW(ws->sample_rows, (int64_t)n * V);
        ws->sample_rows_cap = n;
    }
    return 0;
}

int forward_begin(struct dsv4_model *m, dsv4_step_item *items, int n_items, int scratch_rows, dsv4_error *err) {
    int T = 0;
    int64_t max_rows = 0;
    int rc = step_validate(m, &seq_mem_host, items, n_items, &T, &max_rows, err);
    if (rc) return rc;
    if (workspace_ensure(m, T * (scratch_rows > 1 ? scratch_rows : 1), max_rows))
        return dsv4_fail(err, DSV4_E_NOMEM, "out of memory for a step of %d tokens", T);
    if (sample_rows_ensure(m, items, n_items)) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory for sampling");
    for (int i = 0; i < n_items; i++)
        if (seq_reserve(items[i].seq, items[i].n_tokens))
            return dsv4_fail(err, DSV4_E_NOMEM, "out of memory growing sequence state");
    dsv4_workspace *ws = m->ws;
    dsv4_batch *b = &ws->batch;
    int *first = malloc(sizeof(int) * (size_t)(n_items + 1));
    if (!first) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    free(b->first);
    b->first = first;
    b->T = T;
    b->n_items = n_items;
    b->items = items;
    for (int i = 0, t = 0; i < n_items; i++) {
        b->first[i] = t;
        for (int k = 0; k < items[i].n_tokens; k++, t++) {
            b->item_of[t] = i;
            b->pos[t] = items[i].seq->pos + k;
            b->tok[t] = items[i].tokens[k];
        }
    }
    b->first[n_items] = T;
    return 0;
}

void forward_finish(struct dsv4_model *m, const dsv4_hc_weights *hc_head, const float *norm) {
    dsv4_workspace *ws = m->ws;
    const dsv4_batch *b = &ws->batch;
    const dsv4_config *c = &m->cfg;
    const int hcd = c->hc_mult * c->dim, V = c->vocab_size;
    /* Every row that wants logits, from every item: collapse and normalise each (into ws->u, free now), then
     * one pass of the LM head over all of them, so the head is read once per step however many streams. */
    int R = 0, n_sample_rows = 0;
    for (int i = 0; i < b->n_items; i++) {
        dsv4_step_item *it = &b->items[i];
        const int f = b->first[i];
        int k0 = it->want == DSV4_LOGITS_ALL ? 0 : it->want == DSV4_LOGITS_LAST ? it->n_tokens - 1 : it->n_tokens;
        if (it->sample && it->want == DSV4_LOGITS_NONE) k0 = it->n_tokens - 1;   /* into a scratch row */
        for (int k = k0; k < it->n_tokens; k++, R++) {
            float *h = ws->u + (int64_t)R * c->dim;
            hc_head_one(m->mode, c, hc_head, ws->X + (int64_t)(f + k) * hcd, h);
            rmsnorm(m->mode, h, norm, c->dim, c->norm_eps, h);
            ws->head_out[R] = it->want == DSV4_LOGITS_NONE ? ws->sample_rows + (int64_t)n_sample_rows++ * V
                                                           : it->logits + (int64_t)(it->want == DSV4_LOGITS_ALL ? k : 0) * V;
        }
    }
    linear_bf16_in_scatter(m->dots, m->pool, &m->head, ws->u, R, c->dim, ws->head_out);   /* h: bf16 (rmsnorm) */
    /* the sampled tokens, from each item's last row (core/sample.h: the CUDA kernel draws the same) */
    for (int i = 0, r = 0; i < b->n_items; i++) {
        dsv4_step_item *it = &b->items[i];
        if (!it->sample) continue;
        const float *row = it->want == DSV4_LOGITS_NONE ? ws->sample_rows + (int64_t)r++ * V
                                                        : it->logits + (int64_t)(it->want == DSV4_LOGITS_ALL ? it->n_tokens - 1 : 0) * V;
        *it->token = sample_row(it->sample, it->draw, row, &ws->sample);
    }
    for (int i = 0; i < b->n_items; i++) {
        dsv4_step_item *it = &b->items[i];
        if (it->hidden) memcpy(it->hidden, ws->X + (int64_t)b->first[i] * hcd, sizeof(float) * (size_t)it->n_tokens * hcd);
        dsv4_seq *s = it->seq;
        memcpy(s->tokens + s->pos, it->tokens, sizeof(int32_t) * (size_t)it->n_tokens);
        s->pos += it->n_tokens;
    }
    cpu_profile_mark(&m->prof, CP_HEAD);
}

/* DSpark context features (spec §14.3): after target layer L, the mean of its output's HC streams, for the
 * items that asked for them. */
static void capture_features(struct dsv4_model *m, dsv4_workspace *ws, int L) {
    const dsv4_config *c = &m->cfg;
    int k = -1;
    for (int j = 0; j < c->n_dspark_targets; j++)
        if (c->dspark_target_layers[j] == L) k = j;
    if (k < 0) return;
    const int d = c->dim, hc = c->hc_mult, nt = c->n_dspark_targets;
    const dsv4_batch *b = &ws->batch;
    for (int i = 0; i < b->n_items; i++) {
        float *feat = b->items[i].features;
        if (!feat) continue;
        for (int t = b->first[i]; t < b->first[i + 1]; t++) {
            const float *x = ws->X + (int64_t)t * hc * d;
            float *out = feat + ((int64_t)(t - b->first[i]) * nt + k) * d;
            for (int e = 0; e < d; e++) {
                float s = 0.0f;
                for (int j = 0; j < hc; j++) s += x[j * d + e];
                out[e] = num_bf16_1(m->mode, s / (float)hc);
            }
        }
    }
}

int dsv4_step(dsv4_model *m, dsv4_step_item *items, int n_items, dsv4_error *err) {
    if (m->cuda) return cuda_step(m, items, n_items, err);
    int rc = forward_begin(m, items, n_items, 1, err);
    if (rc) return rc;
    /* From here on nothing can fail: every buffer is reserved. */
    dsv4_workspace *ws = m->ws;
    const int T = ws->batch.T;
    if (m->route_counts) m->counted_tokens += (uint64_t)T;
    cpu_profile_step(&m->prof);
    embed_tokens(m, ws);
    cpu_profile_mark(&m->prof, CP_EMBED);
    const int show = m->progress && T >= 256;   /* long prefills report their progress per layer */
    for (int L = 0; L < m->cfg.n_layers; L++) {
        if (show) fprintf(stderr, "\rdsv4: %d tokens: layer %d/%d", T, L + 1, m->cfg.n_layers);
        block_forward(m, &m->layers[L], L, ws);
        capture_features(m, ws, L);
    }
    if (show) fprintf(stderr, "\r\033[K");
    forward_finish(m, &m->hc_head, m->norm);
    return 0;
}
