#include "core/dspark.h"
#include "backend/cpu/kernels.h"
#include "backend/cuda/cuda_backend.h"
#include "state/statemem.h"
#include "core/attention.h"
#include "core/forward.h"
#include "core/hc.h"
#include "core/norm.h"
#include "core/numerics.h"
#include "core/rope.h"
#include "core/sample.h"
#include "core/workspace.h"
#include "model/model.h"
#include "util/error.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dsv4_dspark_ctx {
    int n_stages, window, D;
    int64_t pos;        /* committed positions */
    float *ring;        /* [n_stages][window][D]: context keys, slot = t mod window, in `mem` */
    const seq_mem *mem; /* the model's state memory: the ring is on the GPU for a cuda model */
    /* host scratch of dsv4_dspark_draft on the CPU (allocated on first use) */
    float *U, *y, *e, *scratch;   /* [gamma][V], [gamma][d], [rank], [V + 2(d + rank)] */
    sample_scratch sc;
};

static float *ring_at(const dsv4_dspark_ctx *c, int stage, int64_t t) {
    return c->ring + ((int64_t)stage * c->window + t % c->window) * c->D;
}

int dsv4_dspark_block_size(const dsv4_model *m) { return m->cfg.dspark_block_size; }
int dsv4_dspark_rank(const dsv4_model *m) { return m->cfg.dspark_markov_rank; }

int dsv4_dspark_ctx_new(dsv4_model *m, dsv4_dspark_ctx **out, dsv4_error *err) {
    if (!m->dspark) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "this checkpoint has no DSpark drafter (mtp.0.main_proj)");
    dsv4_dspark_ctx *c = calloc(1, sizeof *c);
    if (!c) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    c->n_stages = m->dspark->n_stages;
    c->window = m->cfg.window;
    c->D = m->cfg.head_dim;
    c->mem = model_state_mem(m);
    c->ring = c->mem->alloc(sizeof(float) * (size_t)c->n_stages * c->window * c->D);
    if (!c->ring) {
        const char *where = c->mem->name;
        free(c);
        return dsv4_fail(err, DSV4_E_NOMEM, "out of %s memory for the DSpark context", where);
    }
    *out = c;
    return 0;
}

void dsv4_dspark_ctx_free(dsv4_dspark_ctx *c) {
    if (!c) return;
    c->mem->release(c->ring);
    free(c->U);
    free(c->y);
    free(c->e);
    free(c->scratch);
    sample_scratch_free(&c->sc);
    free(c);
}

int64_t dsv4_dspark_ctx_position(const dsv4_dspark_ctx *c) { return c->pos; }

size_t dsv4_dspark_ctx_bytes(const dsv4_dspark_ctx *c) { return sizeof(float) * (size_t)c->n_stages * c->window * c->D; }

int dsv4_dspark_ctx_clone(dsv4_model *m, const dsv4_dspark_ctx *src, dsv4_dspark_ctx **out, dsv4_error *err) {
    dsv4_dspark_ctx *c;
    int rc = dsv4_dspark_ctx_new(m, &c, err);
    if (rc) return rc;
    if (c->n_stages != src->n_stages || c->window != src->window || c->D != src->D || c->mem != src->mem) {
        dsv4_dspark_ctx_free(c);
        return dsv4_fail(err, DSV4_E_STATE, "DSpark: the context to copy belongs to another model");
    }
    /* the whole ring: slots not written yet are zero in both, as in a context fed the same positions */
    c->mem->copy(c->ring, src->ring, dsv4_dspark_ctx_bytes(src));
    c->pos = src->pos;
    *out = c;
    return 0;
}

enum { DSPARK_CTX_HEADER = 24 };

int dsv4_dspark_ctx_encode(const dsv4_dspark_ctx *c, void **buf, size_t *len, dsv4_error *err) {
    const size_t ring = dsv4_dspark_ctx_bytes(c), total = DSPARK_CTX_HEADER + ring;
    uint8_t *p = malloc(total);
    if (!p) return dsv4_fail(err, DSV4_E_NOMEM, "DSpark: out of memory for %zu bytes of context", total);
    const uint32_t head[4] = { (uint32_t)c->n_stages, (uint32_t)c->window, (uint32_t)c->D, 0 };
    memcpy(p, head, sizeof head);
    memcpy(p + 16, &c->pos, 8);
    c->mem->to_host(p + DSPARK_CTX_HEADER, c->ring, ring);
    *buf = p;
    *len = total;
    return 0;
}

int dsv4_dspark_ctx_decode(dsv4_model *m, const void *buf, size_t len, int64_t pos, dsv4_dspark_ctx **out, dsv4_error *err) {
    uint32_t head[4];
    int64_t at;
    if (len < DSPARK_CTX_HEADER) return dsv4_fail(err, DSV4_E_FORMAT, "DSpark context: %zu bytes, not even a header", len);
    memcpy(head, buf, sizeof head);
    memcpy(&at, (const uint8_t *)buf + 16, 8);
    dsv4_dspark_ctx *c;
    int rc = dsv4_dspark_ctx_new(m, &c, err);
    if (rc) return rc;
    const int S = c->n_stages, W = c->window, D = c->D;
    const size_t want = DSPARK_CTX_HEADER + dsv4_dspark_ctx_bytes(c);
    if (head[0] != (uint32_t)S || head[1] != (uint32_t)W || head[2] != (uint32_t)D || head[3] != 0)
        rc = dsv4_fail(err, DSV4_E_STATE, "DSpark context of %u stages x window %u x %u, this model's is %d x %d x %d",
                       head[0], head[1], head[2], S, W, D);
    else if (len != want || at != pos)
        rc = dsv4_fail(err, DSV4_E_STATE, "DSpark context: %zu bytes at position %lld, expected %zu at %lld", len,
                       (long long)at, want, (long long)pos);
    if (rc) { dsv4_dspark_ctx_free(c); return rc; }
    c->mem->from_host(c->ring, (const uint8_t *)buf + DSPARK_CTX_HEADER, dsv4_dspark_ctx_bytes(c));
    c->pos = at;
    *out = c;
    return 0;
}

/* Size the workspace for T tokens and lay out a batch of T positions from pos0 with the given token ids. */
static int setup_batch(dsv4_model *m, int T, int64_t pos0, const int32_t *tok, dsv4_error *err) {
    if (workspace_ensure(m, T, T)) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    dsv4_batch *b = &m->ws->batch;
    b->T = T;
    b->n_items = 0;
    for (int t = 0; t < T; t++) {
        b->pos[t] = pos0 + t;
        b->tok[t] = tok ? tok[t] : 0;
        b->item_of[t] = 0;
    }
    return 0;
}

/* FP8 linear over n rows (OFFICIAL: input quantized per 128, output bf16). x is modified in OFFICIAL mode. */
static void fp8_rows(dsv4_model *m, const dsv4_weight *w, float *x, int n, float *y) {
    if (is_official(m->mode))
        for (int t = 0; t < n; t++) act_quant_fp8_inplace(x + (int64_t)t * w->cols, w->cols, 128);
    linear_bf16_in(m->dots, m->pool, w, x, n, w->cols, y, w->rows);
    num_bf16(m->mode, y, (long)n * w->rows);
}

int dsv4_dspark_commit(dsv4_model *m, dsv4_dspark_ctx *c, const float *features, int n, dsv4_error *err) {
    const dsv4_config *cfg = &m->cfg;
    const dsv4_dspark_head *h = m->dspark;
    if (!h) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "no DSpark drafter");
    if (n <= 0) return 0;
    if (!features) return dsv4_fail(err, DSV4_E_ARG, "DSpark: missing target features");
    if (m->cuda) {
        const int rc = cuda_dspark_commit(m, c->ring, c->pos, features, n, err);
        if (!rc) c->pos += n;
        return rc;
    }
    const int d = cfg->dim, nt = cfg->n_dspark_targets, D = cfg->head_dim, R = cfg->rope_dim;
    int rc = setup_batch(m, n * nt > n ? n * nt : n, c->pos, NULL, err);   /* ex holds [n][nt*d] */
    if (rc) return rc;
    dsv4_workspace *ws = m->ws;
    /* main_x = rmsnorm(main_proj(features), main_norm): ws->ex (input copy) -> ws->xn */
    memcpy(ws->ex, features, sizeof(float) * (size_t)n * nt * d);
    fp8_rows(m, &h->main_proj, ws->ex, n, ws->xn);
    for (int t = 0; t < n; t++) rmsnorm(m->mode, ws->xn + (int64_t)t * d, h->main_norm, d, cfg->norm_eps, ws->xn + (int64_t)t * d);
    /* each stage's context keys: its own wkv and kv_norm on main_x, RoPE at the committed position */
    for (int s = 0; s < h->n_stages; s++) {
        const dsv4_layer *st = &h->stage[s];
        memcpy(ws->u, ws->xn, sizeof(float) * (size_t)n * d);
        fp8_rows(m, &st->wkv, ws->u, n, ws->kv);
        for (int t = 0; t < n; t++) {
            float *k = ws->kv + (int64_t)t * D;
            rmsnorm(m->mode, k, st->kv_norm, D, cfg->norm_eps, k);
            rope_apply(m->mode, &m->rope_window, R, k + D - R, c->pos + t, 0);
            if (is_official(m->mode)) act_quant_fp8_inplace(k, D - R, 64);
            memcpy(ring_at(c, s, c->pos + t), k, sizeof(float) * (size_t)D);
        }
    }
    c->pos += n;
    return 0;
}

/* Attention of the block at one stage: every element sees the context window and the whole block. */
static void block_attention(dsv4_model *m, const dsv4_layer *st, void *vctx, dsv4_workspace *ws) {
    const dsv4_dspark_ctx *c = vctx;
    const dsv4_config *cfg = &m->cfg;
    const int gamma = ws->batch.T;
    const int D = cfg->head_dim, R = cfg->rope_dim, H = cfg->n_heads, W = cfg->window;
    attention_qkv(m, st, ws);   /* ws->q [gamma][H][D], ws->kv [gamma][D]: the block's own queries and keys */
    const int64_t P = c->pos - 1;   /* the last committed position */
    const float **keys = (const float **)ws->keyptrs;
    int nk = 0;
    for (int64_t t = P - W + 1 < 0 ? 0 : P - W + 1; t <= P; t++) keys[nk++] = ring_at(c, (int)(st - m->dspark->stage), t);
    for (int j = 0; j < gamma; j++) keys[nk++] = ws->kv + (int64_t)j * D;
    const float scale = 1.0f / sqrtf((float)D);
    for (int j = 0; j < gamma; j++)
        for (int h = 0; h < H; h++) {
            float *o = ws->o + ((int64_t)j * H + h) * D;
            sink_attention(m->mode, ws->q + ((int64_t)j * H + h) * D, keys, nk, D, scale, st->attn_sink[h], ws->keyscratch, o);
            rope_apply(m->mode, &m->rope_window, R, o + D - R, c->pos + j, 1);
        }
    attention_output(m, st, ws);
}

int dsv4_dspark_block(dsv4_model *m, dsv4_dspark_ctx *c, int32_t anchor, float *y, float *U, dsv4_error *err) {
    const dsv4_config *cfg = &m->cfg;
    const dsv4_dspark_head *h = m->dspark;
    if (!h) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "no DSpark drafter");
    const int gamma = cfg->dspark_block_size, d = cfg->dim, hc = cfg->hc_mult;
    if (anchor < 0 || anchor >= cfg->vocab_size) return dsv4_fail(err, DSV4_E_ARG, "DSpark: anchor %d outside the vocabulary", anchor);
    if (c->pos + gamma > cfg->max_position) return dsv4_fail(err, DSV4_E_RANGE, "DSpark: the block runs past the context");
    int32_t ids[64];
    ids[0] = anchor;
    for (int j = 1; j < gamma; j++) ids[j] = cfg->dspark_noise_token;
    if (m->cuda) return cuda_dspark_block(m, c->ring, c->pos, ids, gamma, y, U, err);
    int rc = setup_batch(m, gamma, c->pos, ids, err);
    if (rc) return rc;
    dsv4_workspace *ws = m->ws;
    /* the last workspace_ensure sized keyscratch for window + rows_cap >= gamma keys per thread */
    for (int j = 0; j < gamma; j++) {
        float *x = ws->X + (int64_t)j * hc * d;
        weight_decode_row(&m->embed, ids[j], x);
        for (int s = 1; s < hc; s++) memcpy(x + (int64_t)s * d, x, sizeof(float) * (size_t)d);
    }
    for (int s = 0; s < h->n_stages; s++) block_forward_with(m, &h->stage[s], block_attention, c, ws);
    for (int j = 0; j < gamma; j++) {
        float *yj = y + (int64_t)j * d, *nj = ws->u + (int64_t)j * d;
        hc_head_one(m->mode, cfg, &h->hc_head, ws->X + (int64_t)j * hc * d, yj);
        rmsnorm(m->mode, yj, h->norm, d, cfg->norm_eps, nj);
    }
    cpu_linear(m->pool, &m->head, ws->u, gamma, d, U, cfg->vocab_size);
    return 0;
}

int dsv4_dspark_draft(dsv4_model *m, dsv4_dspark_ctx *c, int32_t anchor, int k, const dsv4_sampling *sp, uint64_t draw0,
                      int32_t *draft, float *conf, float *probs, float *U, dsv4_error *err) {
    const dsv4_config *cfg = &m->cfg;
    const int gamma = cfg->dspark_block_size, V = cfg->vocab_size, d = cfg->dim, r = cfg->dspark_markov_rank;
    if (!m->dspark) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "no DSpark drafter");
    if (k < 1 || k > gamma) return dsv4_fail(err, DSV4_E_ARG, "DSpark: %d drafts from a block of %d", k, gamma);
    int rc = sample_check(sp, err);
    if (rc) return rc;
    if (anchor < 0 || anchor >= V) return dsv4_fail(err, DSV4_E_ARG, "DSpark: anchor %d outside the vocabulary", anchor);
    if (c->pos + gamma > cfg->max_position) return dsv4_fail(err, DSV4_E_RANGE, "DSpark: the block runs past the context");
    if (m->cuda) {
        int32_t ids[64];
        ids[0] = anchor;
        for (int j = 1; j < gamma; j++) ids[j] = cfg->dspark_noise_token;
        return cuda_dspark_draft(m, c->ring, c->pos, ids, gamma, k, sp, draw0, draft, conf, probs, U, err);
    }
    if (!c->U) {
        c->U = malloc(sizeof(float) * (size_t)gamma * V);
        c->y = malloc(sizeof(float) * (size_t)gamma * d);
        c->e = malloc(sizeof(float) * (size_t)r);
        c->scratch = malloc(sizeof(float) * ((size_t)V + 2 * ((size_t)d + r)));
        if (!c->U || !c->y || !c->e || !c->scratch || sample_scratch_init(&c->sc, V)) {
            free(c->U); free(c->y); free(c->e); free(c->scratch);
            c->U = c->y = c->e = c->scratch = NULL;
            return dsv4_fail(err, DSV4_E_NOMEM, "DSpark: out of memory");
        }
    }
    if ((rc = dsv4_dspark_block(m, c, anchor, c->y, c->U, err))) return rc;
    int32_t prev = anchor;
    for (int j = 0; j < k; j++) {
        float *row = c->U + (int64_t)j * V;
        dsv4_dspark_markov(m, prev, row, c->e, c->scratch);
        if (probs) sample_distribution(sp, row, &c->sc, probs + (int64_t)j * V);
        draft[j] = sample_row(sp, draw0 + (uint64_t)j, row, &c->sc);
        if (conf) conf[j] = dsv4_dspark_confidence(m, c->y + (int64_t)j * d, c->e, c->scratch + V);
        if (U) memcpy(U + (int64_t)j * V, row, sizeof(float) * (size_t)V);
        prev = draft[j];
    }
    return 0;
}

void dsv4_dspark_markov(dsv4_model *m, int32_t prev, float *U_row, float *e, float *scratch) {
    const dsv4_dspark_head *h = m->dspark;
    const int V = m->cfg.vocab_size;
    weight_decode_row(&h->markov_w1, prev, e);
    num_bf16(m->mode, e, m->cfg.dspark_markov_rank);
    cpu_linear(m->pool, &h->markov_w2, e, 1, h->markov_w2.cols, scratch, V);
    for (int v = 0; v < V; v++) U_row[v] += scratch[v];
}

float dsv4_dspark_confidence(dsv4_model *m, const float *y_j, const float *e_j, float *scratch) {
    const int d = m->cfg.dim, r = m->cfg.dspark_markov_rank;
    float *row = scratch, *cat = scratch + d + r;
    weight_decode_row(&m->dspark->confidence, 0, row);
    memcpy(cat, y_j, sizeof(float) * (size_t)d);
    memcpy(cat + d, e_j, sizeof(float) * (size_t)r);
    return dot_f32(row, cat, d + r);
}
