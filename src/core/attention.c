#include "core/attention.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "core/compressor.h"
#include "core/norm.h"
#include "core/numerics.h"
#include "core/rope.h"
#include "state/kvrows.h"
#include "state/sequence.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    struct dsv4_model *m;
    const dsv4_layer *layer;
    int L;
    dsv4_workspace *ws;
    kv_layout kv;            /* the stored form of window and compressed rows (state/kvrows.h) */
    int64_t idx_jobs;        /* index_select: jobs of IDX_JOB_ROWS rows a query */
    int att_group;           /* attend: heads a task (attend_group_size) */
} attn_ctx;

/* ---- per-token preparation: norms, RoPE, ape, QAT simulations ------------------------------------------ */

/* q: per-head unit norm, RoPE; kv: norm, RoPE, (OFFICIAL) FP8 simulation of the non-rope dims (spec §7.1–7.2). */
static void prepare_qkv(void *vctx, int begin, int end, int thread) {
    attn_ctx *a = vctx;
    const dsv4_config *c = &a->m->cfg;
    const dsv4_layer *ly = a->layer;
    dsv4_workspace *ws = a->ws;
    const dsv4_mode mode = a->m->mode;
    const dsv4_rope *rope = layer_rope(a->m, ly->ratio);
    const int D = c->head_dim, R = c->rope_dim, N = D - R, H = c->n_heads;
    for (int t = begin; t < end; t++) {
        const int64_t p = ws->batch.pos[t];
        float *q = ws->q + (int64_t)t * H * D;
        for (int h = 0; h < H; h++) {
            float *qh = q + (int64_t)h * D;
            unit_rmsnorm(mode, qh, D, c->norm_eps);
            rope_apply(mode, rope, R, qh + N, p, 0);
        }
        float *kv = ws->kv + (int64_t)t * D;
        rmsnorm(mode, kv, ly->kv_norm, D, c->norm_eps, kv);
        rope_apply(mode, rope, R, kv + N, p, 0);
        if (is_official(mode)) act_quant_fp8_inplace(kv, N, 64);
    }
}

/* The compressors' ape and the indexer's queries and head weights (ratio-4 and ratio-128 layers). */
static void prepare_tokens(void *vctx, int begin, int end, int thread) {
    attn_ctx *a = vctx;
    const dsv4_config *c = &a->m->cfg;
    const dsv4_layer *ly = a->layer;
    dsv4_workspace *ws = a->ws;
    const dsv4_mode mode = a->m->mode;
    const dsv4_rope *rope = layer_rope(a->m, ly->ratio);
    const int R = c->rope_dim;
    for (int t = begin; t < end; t++) {
        const int64_t p = ws->batch.pos[t];
        if (ly->ratio) {
            const int w = (ly->comp.overlap ? 2 : 1) * ly->comp.width;
            const float *ape = ly->comp.ape + (int64_t)(p % ly->ratio) * w;
            float *z = ws->cz + (int64_t)t * w;
            for (int j = 0; j < w; j++) z[j] += ape[j];
        }
        if (ly->ratio == 4) {
            const int nI = c->index_n_heads, cI = c->index_head_dim, w = 2 * cI;
            const float *ape = ly->icomp.ape + (int64_t)(p % 4) * w;
            float *z = ws->icz + (int64_t)t * w;
            for (int j = 0; j < w; j++) z[j] += ape[j];
            float *qi = ws->qi + (int64_t)t * nI * cI;
            for (int h = 0; h < nI; h++) {
                float *qh = qi + (int64_t)h * cI;
                rope_apply(mode, rope, R, qh + cI - R, p, 0);
                if (is_official(mode)) {
                    hadamard_inplace(qh, cI);
                    num_bf16(mode, qh, cI);
                    act_quant_fp4_inplace(qh, cI, 32);
                }
            }
            const float scale = 1.0f / sqrtf((float)cI) / sqrtf((float)nI);
            float *wi = ws->wi + (int64_t)t * nI;
            for (int h = 0; h < nI; h++) wi[h] = num_bf16_1(mode, wi[h] * scale);
        }
    }
}

/* ---- compressors: every token of every sequence, in position order -------------------------------------- */

static void run_compressors(attn_ctx *a) {
    const dsv4_config *c = &a->m->cfg;
    const dsv4_layer *ly = a->layer;
    dsv4_workspace *ws = a->ws;
    const dsv4_rope *rope = layer_rope(a->m, ly->ratio);
    const int D = c->head_dim, cI = c->index_head_dim;
    for (int i = 0; i < ws->batch.n_items; i++) {
        dsv4_layer_state *ls = &ws->batch.items[i].seq->layer[a->L];
        for (int t = ws->batch.first[i]; t < ws->batch.first[i + 1]; t++) {
            const int64_t p = ws->batch.pos[t];
            const int w = (ly->comp.overlap ? 2 : 1) * D;
            if (compressor_push(&ls->comp, ws->ck + (int64_t)t * w, ws->cz + (int64_t)t * w, p, ws->pooled)) {
                compressor_finish_row(a->m->mode, &ly->comp, rope, c->rope_dim, c->norm_eps, 0, p + 1 - ly->ratio, ws->pooled);
                kv_encode(&ls->crows.lay, ws->pooled, rows_at(&ls->crows, ls->crows.n++));
            }
            if (ly->ratio == 4 &&
                compressor_push(&ls->icomp, ws->ick + (int64_t)t * 2 * cI, ws->icz + (int64_t)t * 2 * cI, p, ws->pooled)) {
                compressor_finish_row(a->m->mode, &ly->icomp, rope, c->rope_dim, c->norm_eps, 1, p - 3, ws->pooled);
                kv_encode(&ls->irows.lay, ws->pooled, rows_at(&ls->irows, ls->irows.n++));
            }
        }
    }
}

/* ---- lightning indexer: per-query top-k of the visible compressed rows (spec §9) ------------------------ */

/* A score (the kernel set's index_scores, backend/cpu/isa/index.c, states the order): per head a dot_f32, bf16 in
 * OFFICIAL mode; over the heads in order the positive ones times their weights (bf16), added; bf16 of the sum. */

/* "a ranks below b": lower score, or equal score and higher row index (ties go to the lower index). */
static inline int ranks_below(float sa, int ia, float sb, int ib) { return sa < sb || (sa == sb && ia > ib); }

static void heap_sift_down(float *hs, int32_t *hi, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && ranks_below(hs[l], hi[l], hs[w], hi[w])) w = l;
        if (r < n && ranks_below(hs[r], hi[r], hs[w], hi[w])) w = r;
        if (w == i) return;
        float ts = hs[i]; hs[i] = hs[w]; hs[w] = ts;
        int32_t ti = hi[i]; hi[i] = hi[w]; hi[w] = ti;
        i = w;
    }
}

/* The heap of a query's K best rows so far (its root the worst of them) offered row k's score s. */
static void heap_offer(float *hs, int32_t *hi, int *hn, int K, float s, int32_t k) {
    if (*hn < K) {   /* sift up */
        int i = (*hn)++;
        hs[i] = s; hi[i] = k;
        while (i > 0) {
            int p = (i - 1) / 2;
            if (!ranks_below(hs[i], hi[i], hs[p], hi[p])) break;
            float ts = hs[i]; hs[i] = hs[p]; hs[p] = ts;
            int32_t ti = hi[i]; hi[i] = hi[p]; hi[p] = ti;
            i = p;
        }
    } else if (ranks_below(hs[0], hi[0], s, k)) {
        hs[0] = s; hi[0] = k;
        heap_sift_down(hs, hi, *hn, 0);
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Query t's scores of rows k0 .. k0 + nb - 1 (nb <= CPU_INDEX_ROWS) into sc, through the kernel set: a stored row
 * is decoded once for all nI heads (exact: the same bits as an fp32 row) into dec (nb rows of cI floats). */
static void score_block(const attn_ctx *a, int t, int64_t k0, int nb, float *dec, float *sc) {
    const dsv4_config *c = &a->m->cfg;
    const dsv4_workspace *ws = a->ws;
    const int nI = c->index_n_heads, cI = c->index_head_dim;
    const dsv4_layer_state *ls = &ws->batch.items[ws->batch.item_of[t]].seq->layer[a->L];
    const float *rows[CPU_INDEX_ROWS];
    for (int r = 0; r < nb; r++) {
        rows[r] = (const float *)(const void *)rows_at(&ls->irows, k0 + r);
        if (ls->irows.lay.fmt != DSV4_KV_F32) {
            kv_decode(&ls->irows.lay, rows_at(&ls->irows, k0 + r), dec + (int64_t)r * cI);
            rows[r] = dec + (int64_t)r * cI;
        }
    }
    dsv4_pool_kernels(a->m->pool)->index_scores(ws->qi + (int64_t)t * nI * cI, ws->wi + (int64_t)t * nI, rows, nb, nI, cI,
                                                is_official(a->m->mode), sc);
}

/* Rows scored a block at a time: CPU_INDEX_ROWS of them, or one when that many would not fit KV_MAX_WIDTH floats
 * (no real indexer is that wide). */
static int rows_per_block(const dsv4_config *c) { return CPU_INDEX_ROWS * c->index_head_dim <= KV_MAX_WIDTH ? CPU_INDEX_ROWS : 1; }

static int64_t index_rows_of(const dsv4_workspace *ws, int t) { return (ws->batch.pos[t] + 1) / 4; }   /* rows with (k+1)*4 <= p+1 */

/* The selection of query t once its heap holds its K best rows (the thread's): in row order. n <= K: every row,
 * without scores (select_all_rows). */
static void select_finish(const attn_ctx *a, int t, int thread) {
    const int K = a->m->cfg.index_topk;
    int32_t *sel = a->ws->sel + (int64_t)t * K;
    memcpy(sel, a->ws->heapscratch + (int64_t)thread * K, sizeof(int32_t) * (size_t)K);
    qsort(sel, (size_t)K, sizeof(int32_t), cmp_i32);   /* attend in row order */
    a->ws->n_sel[t] = K;
}
static int select_all_rows(const attn_ctx *a, int t) {
    const int64_t n = index_rows_of(a->ws, t);
    if (n > a->m->cfg.index_topk) return 0;
    int32_t *sel = a->ws->sel + (int64_t)t * a->m->cfg.index_topk;
    for (int k = 0; k < n; k++) sel[k] = k;
    a->ws->n_sel[t] = (int)n;
    return 1;
}

/* One thread a query: score its rows block by block, each offered to its heap in row order. */
static void select_rows(void *vctx, int begin, int end, int thread) {
    attn_ctx *a = vctx;
    dsv4_workspace *ws = a->ws;
    const int K = a->m->cfg.index_topk, per = rows_per_block(&a->m->cfg);
    float *hs = ws->idxscratch + (int64_t)thread * K;
    int32_t *hi = ws->heapscratch + (int64_t)thread * K;
    float dec[KV_MAX_WIDTH];
    for (int t = begin; t < end; t++) {
        if (select_all_rows(a, t)) continue;
        const int64_t n = index_rows_of(ws, t);
        int hn = 0;
        for (int64_t k0 = 0; k0 < n; k0 += per) {
            const int nb = n - k0 < per ? (int)(n - k0) : per;
            float sc[CPU_INDEX_ROWS];
            score_block(a, t, k0, nb, dec, sc);
            for (int r = 0; r < nb; r++) heap_offer(hs, hi, &hn, K, sc[r], (int32_t)(k0 + r));
        }
        select_finish(a, t, thread);
    }
}

/* A step of fewer queries than threads (decode) would score each query's rows on one thread. Instead its rows are
 * scored in jobs of IDX_JOB_ROWS spread over the pool, into keyscratch (query t's at t (window + rows_cap): the
 * attention reuses it only later), then each query's heap takes its scores in row order as select_rows would: the
 * same scores, the same selection. */
enum { IDX_JOB_ROWS = 1024 };
static float *index_scores_of(const attn_ctx *a, int t) {
    return a->ws->keyscratch + (int64_t)t * (a->m->cfg.window + a->ws->rows_cap);
}

static void score_row_jobs(void *vctx, int begin, int end, int thread) {
    attn_ctx *a = vctx;
    const int per = rows_per_block(&a->m->cfg);
    const int64_t jq = a->idx_jobs;
    float dec[KV_MAX_WIDTH];
    for (int j = begin; j < end; j++) {
        const int t = (int)(j / jq);
        const int64_t n = index_rows_of(a->ws, t), k1 = (j % jq + 1) * IDX_JOB_ROWS < n ? (j % jq + 1) * IDX_JOB_ROWS : n;
        if (n <= a->m->cfg.index_topk) continue;
        float *out = index_scores_of(a, t);
        for (int64_t k0 = (j % jq) * IDX_JOB_ROWS; k0 < k1; k0 += per)
            score_block(a, t, k0, k1 - k0 < per ? (int)(k1 - k0) : per, dec, out + k0);
    }
}

static void select_from_scores(void *vctx, int begin, int end, int thread) {
    attn_ctx *a = vctx;
    dsv4_workspace *ws = a->ws;
    const int K = a->m->cfg.index_topk;
    float *hs = ws->idxscratch + (int64_t)thread * K;
    int32_t *hi = ws->heapscratch + (int64_t)thread * K;
    for (int t = begin; t < end; t++) {
        if (select_all_rows(a, t)) continue;
        const int64_t n = index_rows_of(ws, t);
        const float *sc = index_scores_of(a, t);
        int hn = 0;
        for (int64_t k = 0; k < n; k++) heap_offer(hs, hi, &hn, K, sc[k], (int32_t)k);
        select_finish(a, t, thread);
    }
}

/* Every query's top-K rows (ws->sel, ws->n_sel). */
static void index_select(attn_ctx *a, int T) {
    dsv4_pool *pool = a->m->pool;
    int64_t n_max = 0;
    for (int t = 0; t < T; t++) n_max = index_rows_of(a->ws, t) > n_max ? index_rows_of(a->ws, t) : n_max;
    a->idx_jobs = (n_max + IDX_JOB_ROWS - 1) / IDX_JOB_ROWS;   /* a query's jobs: the step's most rows, cut */
    const int64_t jobs = (int64_t)T * a->idx_jobs;
    if (T < dsv4_pool_threads(pool) && jobs <= INT32_MAX) {
        dsv4_pool_run(pool, (int)jobs, score_row_jobs, a);
        dsv4_pool_run(pool, T, select_from_scores, a);
    } else
        dsv4_pool_run(pool, T, select_rows, a);
}

/* ---- sink softmax attention of one (token, head) (spec §7.3–7.5) ------------------------------------------ */

/* sink_attention over keys in a stored KV format: kv_dot / kv_axpy give the bits of dot_f32 and the fp32 P.V over
 * the decoded rows, so a lossless format changes nothing. */
static void sink_attention_kv(dsv4_mode mode, const kv_layout *kv, const float *q, const uint8_t *const *keys, int nk,
                              float scale, float sink, float *scores, float *out) {
    const int D = kv->width;
    float mx = -INFINITY;
    for (int i = 0; i < nk; i++) {
        scores[i] = kv_dot(kv, q, keys[i]) * scale;
        mx = fmaxf(mx, scores[i]);
    }
    /* the sink joins the denominator only (a logit whose value vector is zero); it is not in the max */
    float den = expf(sink - mx);
    memset(out, 0, sizeof(float) * (size_t)D);
    for (int i = 0; i < nk; i++) {
        const float e = expf(scores[i] - mx);
        den += e;
        const float pe = num_bf16_1(mode, e);   /* official: bf16 probabilities for P.V, fp32 denominator */
        kv_axpy(kv, pe, keys[i], out);
    }
    const float inv = 1.0f / den;
    for (int j = 0; j < D; j++) out[j] *= inv;
    num_bf16(mode, out, D);
}

void sink_attention(dsv4_mode mode, const float *q, const float *const *keys, int nk, int D, float scale, float sink,
                    float *scores, float *out) {
    kv_layout f32;
    kv_layout_init(&f32, DSV4_KV_F32, KV_ROW_MAIN, D, 0);
    sink_attention_kv(mode, &f32, q, (const uint8_t *const *)keys, nk, scale, sink, scores, out);
}

/* Heads of one query that attend together. V4 has one KV head, so all heads of a token read the same key rows;
 * a group of G <= ATT_GROUP heads reads (and decodes from the stored format) each row once for all G, instead of
 * once a head, and runs the G heads' chains side by side. Each head's numbers are sink_attention_kv's, operation
 * for operation: its scores dot_f32(q_h, row) * scale (dot4_f32 is four dot_f32 bit for bit, kv_dot is dot_f32
 * of the decoded row), one max, den = e^(sink - max) + the e_i in key order, and out[j] the chain
 * fmaf(p_i, v_i[j], .) over the keys in order from 0.0f, then times 1/den. So the group size never changes a bit;
 * only how many tasks a step has (attend_group_size). */
enum { ATT_PV_COLS = 64 };

/* out[g][j0 .. j0 + w) for the G heads: the P.V chains of one block of columns, the block's accumulators held for
 * all keys (ATT_PV_COLS columns x G heads), each key's block of values read once for the group. */
static void pv_block(const kv_layout *kv, const uint8_t *const *keys, int nk, const float *P, int G, int j0, int w,
                     const float *inv, float *const *out) {
    float acc[ATT_GROUP][ATT_PV_COLS], vbuf[ATT_PV_COLS];
    for (int g = 0; g < G; g++)
        for (int j = 0; j < ATT_PV_COLS; j++) acc[g][j] = 0.0f;
    for (int i = 0; i < nk; i++) {
        const float *v = vbuf;
        if (kv->fmt == DSV4_KV_F32) v = (const float *)(const void *)keys[i] + j0;
        else kv_decode_range(kv, keys[i], j0, w, vbuf);
        for (int g = 0; g < G; g++) {
            const float p = P[(int64_t)g * nk + i];
            for (int j = 0; j < w; j++) acc[g][j] = fmaf(p, v[j], acc[g][j]);
        }
    }
    for (int g = 0; g < G; g++)
        for (int j = 0; j < w; j++) out[g][j0 + j] = acc[g][j] * inv[g];
}

#if defined(DSV4_AVX512)
/* pv_block for a full group and block (ATT_GROUP = 4 heads x 64 columns), its 16 accumulators in registers (the
 * compiler kept pv_block's in memory): the same fmaf per element, so the same bits. */
static void pv_block_4x64(const kv_layout *kv, const uint8_t *const *keys, int nk, const float *P, int j0,
                          const float *inv, float *const *out) {
    __m512 acc[4][4];
    float vbuf[ATT_PV_COLS];
    for (int g = 0; g < 4; g++)
        for (int k = 0; k < 4; k++) acc[g][k] = _mm512_setzero_ps();
    for (int i = 0; i < nk; i++) {
        const float *v = vbuf;
        if (kv->fmt == DSV4_KV_F32) v = (const float *)(const void *)keys[i] + j0;
        else kv_decode_range(kv, keys[i], j0, ATT_PV_COLS, vbuf);
        const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16), v2 = _mm512_loadu_ps(v + 32),
                     v3 = _mm512_loadu_ps(v + 48);
        for (int g = 0; g < 4; g++) {
            const __m512 p = _mm512_set1_ps(P[(int64_t)g * nk + i]);
            acc[g][0] = _mm512_fmadd_ps(p, v0, acc[g][0]);
            acc[g][1] = _mm512_fmadd_ps(p, v1, acc[g][1]);
            acc[g][2] = _mm512_fmadd_ps(p, v2, acc[g][2]);
            acc[g][3] = _mm512_fmadd_ps(p, v3, acc[g][3]);
        }
    }
    for (int g = 0; g < 4; g++) {
        const __m512 s = _mm512_set1_ps(inv[g]);
        for (int k = 0; k < 4; k++) _mm512_storeu_ps(out[g] + j0 + 16 * k, _mm512_mul_ps(acc[g][k], s));
    }
}
#endif

void sink_attention_heads(dsv4_mode mode, const kv_layout *kv, const float *const *q, int G, const uint8_t *const *keys,
                          int nk, float scale, const float *sink, float *P, float *const *out) {
    const int D = kv->width;
    float row[KV_MAX_WIDTH], inv[ATT_GROUP];
    for (int i = 0; i < nk; i++) {
        const float *r = row;
        if (kv->fmt == DSV4_KV_F32) r = (const float *)(const void *)keys[i];
        else kv_decode(kv, keys[i], row);
        float s[ATT_GROUP];
        if (G == 4) dot4_f32(r, q, D, s);
        else
            for (int g = 0; g < G; g++) s[g] = dot_f32(q[g], r, D);
        for (int g = 0; g < G; g++) P[(int64_t)g * nk + i] = s[g] * scale;
    }
    for (int g = 0; g < G; g++) {   /* P becomes the probabilities the P.V reads */
        float *Pg = P + (int64_t)g * nk, mx = -INFINITY;
        for (int i = 0; i < nk; i++) mx = Pg[i] > mx ? Pg[i] : mx;   /* fmaxf's, NaN skipped; no libm call */
        float den = expf(sink[g] - mx);
        for (int i = 0; i < nk; i++) {
            const float e = expf(Pg[i] - mx);
            den += e;
            Pg[i] = num_bf16_1(mode, e);
        }
        inv[g] = 1.0f / den;
    }
    for (int j0 = 0; j0 < D; j0 += ATT_PV_COLS) {
#if defined(DSV4_AVX512)
        if (G == 4 && D - j0 >= ATT_PV_COLS) {
            pv_block_4x64(kv, keys, nk, P, j0, inv, out);
            continue;
        }
#endif
        pv_block(kv, keys, nk, P, G, j0, D - j0 < ATT_PV_COLS ? D - j0 : ATT_PV_COLS, inv, out);
    }
    for (int g = 0; g < G; g++) num_bf16(mode, out[g], D);
}

/* Heads a task: up to ATT_GROUP, fewer where a step has too few tokens to give every thread two tasks (decode on
 * many cores). Any size gives the same numbers. */
static int attend_group_size(int T, int H, int threads) {
    int G = ATT_GROUP;
    while (G > 1 && (int64_t)T * ((H + G - 1) / G) < 2 * (int64_t)threads) G /= 2;
    return G;
}

static void attend(void *vctx, int begin, int end, int thread) {
    attn_ctx *a = vctx;
    const struct dsv4_model *m = a->m;
    const dsv4_config *c = &m->cfg;
    const dsv4_layer *ly = a->layer;
    dsv4_workspace *ws = a->ws;
    const dsv4_mode mode = m->mode;
    const int D = c->head_dim, R = c->rope_dim, N = D - R, H = c->n_heads, W = c->window;
    const float scale = 1.0f / sqrtf((float)D);
    const int G = a->att_group, groups = (H + G - 1) / G;
    float *sc = ws->keyscratch + (int64_t)thread * ATT_GROUP * (W + ws->rows_cap);
    const uint8_t **keys = (const uint8_t **)(void *)(ws->keyptrs + (int64_t)thread * (W + ws->rows_cap));
    for (int task = begin; task < end; task++) {
        const int t = task / groups, h0 = task % groups * G, nh = H - h0 < G ? H - h0 : G;
        const int item = ws->batch.item_of[t];
        const dsv4_seq *seq = ws->batch.items[item].seq;
        const dsv4_layer_state *ls = &seq->layer[a->L];
        const int f = ws->batch.first[item];
        const int64_t p = ws->batch.pos[t], p0 = ws->batch.pos[f];
        /* key set: window positions (chronological), then compressed rows (row order). The chunk's own keys
         * are read from ws->kv, which holds them in the stored format too (see attention_forward). */
        int nk = 0;
        for (int64_t s = p - W + 1 < 0 ? 0 : p - W + 1; s <= p; s++)
            keys[nk++] = s >= p0 ? (const uint8_t *)(ws->kv + (int64_t)(f + (s - p0)) * D) : seq_ring_at(seq, ls, s);
        if (ly->ratio == 128) {
            const int64_t n = (p + 1) / 128;
            for (int64_t k = 0; k < n; k++) keys[nk++] = rows_at(&ls->crows, k);
        } else if (ly->ratio == 4) {
            const int32_t *sel = ws->sel + (int64_t)t * c->index_topk;
            for (int k = 0; k < ws->n_sel[t]; k++) keys[nk++] = rows_at(&ls->crows, sel[k]);
        }
        const float *q[ATT_GROUP];
        float *o[ATT_GROUP];
        for (int g = 0; g < nh; g++) {
            q[g] = ws->q + ((int64_t)t * H + h0 + g) * D;
            o[g] = ws->o + ((int64_t)t * H + h0 + g) * D;
        }
        sink_attention_heads(mode, &a->kv, q, nh, keys, nk, scale, ly->attn_sink + h0, sc, o);
        for (int g = 0; g < nh; g++) rope_apply(mode, layer_rope(m, ly->ratio), R, o[g] + N, p, 1);
    }
}

/* ---- the sub-layer ---------------------------------------------------------------------------------------- */

/* Re-write each token's K=V row of ws->kv ([T][D] floats) in the stored KV format, in place (a stored row is
 * never larger than its fp32 form). Every query then reads the chunk's own keys exactly as it would read them
 * from the ring on a later call, which keeps one-shot, chunked and decode bit-identical in every format. */
static void store_chunk_keys(const kv_layout *kv, float *rows, int T) {
    float tmp[KV_MAX_WIDTH];
    for (int t = 0; t < T; t++) {
        float *row = rows + (int64_t)t * kv->width;
        memcpy(tmp, row, sizeof(float) * (size_t)kv->width);
        kv_encode(kv, tmp, (uint8_t *)row);
    }
}

void attention_qkv(struct dsv4_model *m, const dsv4_layer *ly, dsv4_workspace *ws) {
    const dsv4_config *c = &m->cfg;
    const dsv4_mode mode = m->mode;
    const int T = ws->batch.T, d = c->dim, D = c->head_dim, H = c->n_heads;
    attn_ctx a = { m, ly, 0, ws, { 0 }, 0 };
    /* FP8 linears see their input quantized per 128 columns (OFFICIAL); the compressors and the indexer's
     * weights_proj read the unquantized x. ws->u is free here and holds the quantized copy. */
    const float *x8 = ws->xn;
    if (is_official(mode)) {
        memcpy(ws->u, ws->xn, sizeof(float) * (size_t)T * d);
        for (int t = 0; t < T; t++) act_quant_fp8_inplace(ws->u + (int64_t)t * d, d, 128);
        x8 = ws->u;
    }
    linear_bf16_in(m->dots, m->pool, &ly->wq_a, x8, T, d, ws->qr, c->q_lora);
    num_bf16(mode, ws->qr, (long)T * c->q_lora);
    for (int t = 0; t < T; t++) {
        float *qr = ws->qr + (int64_t)t * c->q_lora;
        rmsnorm(mode, qr, ly->q_norm, c->q_lora, c->norm_eps, qr);
        if (is_official(mode)) act_quant_fp8_inplace(qr, c->q_lora, 128); /* input of wq_b and indexer.wq_b */
    }
    linear_bf16_in(m->dots, m->pool, &ly->wq_b, ws->qr, T, c->q_lora, ws->q, H * D);
    num_bf16(mode, ws->q, (long)T * H * D);
    linear_bf16_in(m->dots, m->pool, &ly->wkv, x8, T, d, ws->kv, D);
    num_bf16(mode, ws->kv, (long)T * D);
    dsv4_pool_run(m->pool, T, prepare_qkv, &a);
}

void attention_output(struct dsv4_model *m, const dsv4_layer *ly, dsv4_workspace *ws) {
    const dsv4_config *c = &m->cfg;
    const dsv4_mode mode = m->mode;
    const int T = ws->batch.T, d = c->dim, D = c->head_dim, H = c->n_heads, G = c->o_groups;
    /* grouped low-rank output: group g's heads through wo_a rows [g*o_lora, (g+1)*o_lora) */
    const int HD_G = H * D / G, zl = G * c->o_lora;
    for (int g = 0; g < G; g++) {
        dsv4_weight wg = weight_rows(&ly->wo_a, g * c->o_lora, c->o_lora);
        linear_bf16_in(m->dots, m->pool, &wg, ws->o + (int64_t)g * HD_G, T, H * D, ws->z + (int64_t)g * c->o_lora, zl);
    }
    num_bf16(mode, ws->z, (long)T * zl);
    if (is_official(mode))
        for (int t = 0; t < T; t++) act_quant_fp8_inplace(ws->z + (int64_t)t * zl, zl, 128);
    linear_bf16_in(m->dots, m->pool, &ly->wo_b, ws->z, T, zl, ws->sub, d);
    num_bf16(mode, ws->sub, (long)T * d);
}

void attention_forward(struct dsv4_model *m, const dsv4_layer *ly, int L, dsv4_workspace *ws) {
    const dsv4_config *c = &m->cfg;
    const dsv4_mode mode = m->mode;
    const int T = ws->batch.T, d = c->dim, D = c->head_dim, H = c->n_heads;
    attn_ctx a = { m, ly, L, ws, { 0 }, 0 };
    kv_layout_init(&a.kv, m->kv_format, KV_ROW_MAIN, D, c->rope_dim);
    attention_qkv(m, ly, ws);
    cpu_profile_mark(&m->prof, CP_QKV);
    if (ly->ratio) {
        const int w = (ly->comp.overlap ? 2 : 1) * D;
        linear_bf16_in(m->dots, m->pool, &ly->comp.wkv, ws->xn, T, d, ws->ck, w);
        linear_bf16_in(m->dots, m->pool, &ly->comp.wgate, ws->xn, T, d, ws->cz, w);
        cpu_profile_mark(&m->prof, CP_COMPRESS);
    }
    if (ly->ratio == 4) {
        const int nI = c->index_n_heads, cI = c->index_head_dim;
        linear_bf16_in(m->dots, m->pool, &ly->icomp.wkv, ws->xn, T, d, ws->ick, 2 * cI);
        linear_bf16_in(m->dots, m->pool, &ly->icomp.wgate, ws->xn, T, d, ws->icz, 2 * cI);
        linear_bf16_in(m->dots, m->pool, &ly->idx_wq_b, ws->qr, T, c->q_lora, ws->qi, nI * cI);
        num_bf16(mode, ws->qi, (long)T * nI * cI);
        linear_bf16_in(m->dots, m->pool, &ly->idx_weights_proj, ws->xn, T, d, ws->wi, nI);
        num_bf16(mode, ws->wi, (long)T * nI);
        cpu_profile_mark(&m->prof, CP_INDEX);
    }
    if (ly->ratio) dsv4_pool_run(m->pool, T, prepare_tokens, &a);
    cpu_profile_mark(&m->prof, CP_COMPRESS);
    if (a.kv.fmt != DSV4_KV_F32) store_chunk_keys(&a.kv, ws->kv, T);
    cpu_profile_mark(&m->prof, CP_ATTEND);
    if (ly->ratio) run_compressors(&a);
    cpu_profile_mark(&m->prof, CP_COMPRESS);
    if (ly->ratio == 4) index_select(&a, T);
    cpu_profile_mark(&m->prof, CP_INDEX);
    a.att_group = attend_group_size(T, H, dsv4_pool_threads(m->pool));
    dsv4_pool_run(m->pool, T * ((H + a.att_group - 1) / a.att_group), attend, &a);
    cpu_profile_mark(&m->prof, CP_ATTEND);
    attention_output(m, ly, ws);
    cpu_profile_mark(&m->prof, CP_OUTPUT);

    /* finally the window rings: only now, so every query above read the chunk's own keys from ws->kv */
    for (int i = 0; i < ws->batch.n_items; i++) {
        dsv4_seq *seq = ws->batch.items[i].seq;
        const dsv4_layer_state *ls = &seq->layer[L];
        for (int t = ws->batch.first[i]; t < ws->batch.first[i + 1]; t++)
            memcpy(seq_ring_at(seq, ls, ws->batch.pos[t]), ws->kv + (int64_t)t * D, a.kv.bytes);
    }
    cpu_profile_mark(&m->prof, CP_ATTEND);
}
