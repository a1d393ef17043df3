/* cu_attention on long key lists (issue 18), on synthetic device buffers, without a model:
 *   - every output of a query (all heads, de-rotated) against a double-precision reference of the sink attention
 *     written here (core/attention.c sink_attention_kv's math: scores q.k / sqrt(D), one max, the sink in the
 *     denominator only, OFFICIAL bf16 probabilities and outputs, the RoPE de-rotation at the query's position),
 *     over the stored rows decoded on the CPU (state/kvrows.c kv_decode);
 *   - with 20,000 ratio-128 rows behind a 128-key window (315 chunks of keys), a top-512 selection of ratio-4 rows,
 *     a window alone, and an odd shape (70 heads: two head groups; D 96: a partial column slice);
 *   - batch invariance: a query computed alone (decode: its window from the ring) and in a step beside another
 *     sequence with its two predecessors (its window partly from the step's own rows) and with a scratch so small
 *     that the step runs in groups of two queries gives the same bits (memcmp);
 *   - OFFICIAL cases twice: on CUDA cores (fp32 fmaf) and on bf16 tensor cores (cu_attention's mma argument; q is
 *     bf16 here as the model's is, the stored rows decode to bf16 values), each against the reference and each
 *     batch-invariant; the two paths' difference is printed.
 *   - decode shapes (1 to 4 queries a step; 64 heads and few heads, 8 and 20: partial head groups; key counts on
 *     both sides of the 64-key chunk boundaries, 62 .. 193; fp8 and bf16 rows; both modes): each query's outputs in
 *     every step the same bits as alone, and against the reference (the head-split grid of issue 18);
 *   - ATT_TEST_DUMP=FILE appends every output of every step to FILE, so that two builds of the kernels (e.g. the
 *     grid before and after a change of its split, tools/gpu/shim/shim_attention_ab.sh) can be compared bit for bit.
 * The test of the test: the reference without one chunk of keys must differ from the full one by far more than
 * the tolerance (printed; EXACT: 20x; OFFICIAL, whose tolerance is looser, where the key list is short enough
 * for one chunk to matter: 5x), so a lost or doubled chunk cannot pass. A fragment bug in the tensor-core path
 * (-DATT_MMA_BUG=1 or =2 in tools/gpu/shim/shim_attention.sh) fails it.
 *
 * Without a GPU: -DATT_TEST_EMULATE makes the "device" the host (tests/gpu/emulate_attention.h) with cu_attention a
 * C port of the chunked kernels' float order (how the tolerances below were chosen); tools/gpu/shim/shim_attention.sh
 * runs k_attention.cu's own chunked kernels and launcher on the CPU instead (a check of their indexing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cu_runtime.h"
#include "model/formats.h"
#include "model/tiny.h"
#include "state/kvrows.h"

#define W 128       /* window */
#define RING 136    /* ring slots (more than the window, as a model with speculative slack has) */
#define TOPK 512
#define STEP 3      /* tokens of each item of the batched step */
#define EXACT_TOL 2e-5
/* OFFICIAL: bf16 probabilities and outputs; a rounding decision flipped by the last bits moves an output by one bf16
 * step (up to 2^-7 of the head's largest output), the de-rotation's second rounding by one more */
#define OFFICIAL_TOL 3e-2

#ifdef ATT_TEST_EMULATE
#include "emulate_attention.h"
#else
static void *dev_put(const void *h, size_t n) {
    void *d = cu_malloc(n ? n : 1);
    assert_non_null(d);
    if (n && h) assert_int_equal(cu_upload(d, h, n), 0);
    return d;
}
static void dev_get(void *h, const void *d, size_t n) { assert_int_equal(cu_download(h, d, n), 0); }
static void dev_free(void *d) { cu_free(d); }
static void dev_sync(void) {
    dsv4_error err;
    if (cu_finish(NULL, "attention", &err)) fail_msg("%s", err.msg);
}
#endif

typedef struct {
    const char *name;
    int H, D, R, fmt, ratio, official;
    int64_t P;   /* the long sequence's query position */
    int64_t Q;   /* the short sequence's last position */
} acase;

/* One sequence's stored rows: the window row of every position base .. last, the ring holding the latest RING of
 * them by slot, and the compressed rows. */
typedef struct {
    int64_t base, last, n_rows;
    uint8_t *pos_rows, *ring, *crows;   /* host */
    float *dpos, *drows;                /* decoded (the reference's keys) */
    uint8_t *d_ring, *d_crows;          /* device */
    float mu[4096];                     /* the rows' mean: keeps the outputs away from zero (no cancellation) */
} seqdata;

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

static float urand(dsv4_rng *r) { return (float)(2.0 * dsv4_rng_uniform(r) - 1.0); }

static void gen_row(dsv4_rng *r, const kv_layout *kl, const float *mu, uint8_t *dst) {
    float x[4096];
    for (int j = 0; j < kl->width; j++) x[j] = mu[j] + urand(r);
    kv_encode(kl, x, dst);
}

static int64_t rows_needed(int ratio, int64_t p) { return ratio == 128 ? (p + 1) / 128 : ratio == 4 ? (p + 1) / 4 : 0; }

static void seq_make(seqdata *s, const kv_layout *kl, int ratio, int64_t last, uint64_t seed) {
    dsv4_rng r;
    dsv4_rng_seed(&r, seed);
    memset(s, 0, sizeof *s);
    for (int j = 0; j < kl->width; j++) s->mu[j] = 0.3f * urand(&r);
    s->last = last;
    s->base = last - RING + 1 > 0 ? last - RING + 1 : 0;
    const int64_t n_pos = last - s->base + 1, B = (int64_t)kl->bytes, D = kl->width;
    s->n_rows = rows_needed(ratio, last);
    s->pos_rows = malloc((size_t)(n_pos * B));
    s->ring = calloc(RING, (size_t)B);
    s->crows = malloc((size_t)((s->n_rows ? s->n_rows : 1) * B));
    s->dpos = malloc(sizeof(float) * (size_t)(n_pos * D));
    s->drows = malloc(sizeof(float) * (size_t)((s->n_rows ? s->n_rows : 1) * D));
    assert_true(s->pos_rows && s->ring && s->crows && s->dpos && s->drows);
    for (int64_t x = s->base; x <= last; x++) {
        uint8_t *row = s->pos_rows + (x - s->base) * B;
        gen_row(&r, kl, s->mu, row);
        memcpy(s->ring + (x % RING) * B, row, (size_t)B);
        kv_decode(kl, row, s->dpos + (x - s->base) * D);
    }
    for (int64_t k = 0; k < s->n_rows; k++) {
        gen_row(&r, kl, s->mu, s->crows + k * B);
        kv_decode(kl, s->crows + k * B, s->drows + k * D);
    }
    s->d_ring = dev_put(s->ring, (size_t)(RING * B));
    s->d_crows = dev_put(s->crows, (size_t)((s->n_rows ? s->n_rows : 1) * B));
}

static void seq_free(seqdata *s) {
    free(s->pos_rows); free(s->ring); free(s->crows); free(s->dpos); free(s->drows);
    dev_free(s->d_ring); dev_free(s->d_crows);
}

/* The query of (sequence, position): the same numbers in every step it is part of. Heads get different scales
 * (flat to peaked softmaxes). OFFICIAL: bf16 values, as the model's q is (k_qkv_prepare rounds every element). */
static void query_of(const acase *c, int seq, int64_t p, float *q) {
    dsv4_rng r;
    dsv4_rng_seed(&r, mix64((uint64_t)p * 4 + (uint64_t)seq + 77));
    for (int h = 0; h < c->H; h++) {
        const float scale = 0.5f + 0.5f * (float)(h % 8);
        for (int j = 0; j < c->D; j++) {
            const float x = scale * urand(&r);
            q[(int64_t)h * c->D + j] = c->official ? round_bf16(x) : x;
        }
    }
}

/* The ratio-4 selection of (sequence, position): every visible row when there are at most TOPK, else TOPK
 * distinct rows in increasing order spread over all of them. */
static int sel_of(const acase *c, int seq, int64_t p, int32_t *sel) {
    const int64_t vis = rows_needed(4, p);
    if (c->ratio != 4) return 0;
    if (vis <= TOPK) {
        for (int k = 0; k < vis; k++) sel[k] = k;
        return (int)vis;
    }
    dsv4_rng r;
    dsv4_rng_seed(&r, mix64((uint64_t)p * 4 + (uint64_t)seq + 991));
    const int64_t span = vis / TOPK;
    for (int k = 0; k < TOPK; k++) sel[k] = (int32_t)(k * span + (int64_t)dsv4_rng_below(&r, (uint32_t)span));
    return TOPK;
}

static void heads_of(const acase *c, float *sink, float *freq) {
    dsv4_rng r;
    dsv4_rng_seed(&r, 4242);
    for (int h = 0; h < c->H; h++) sink[h] = 3.0f * urand(&r);
    if (c->H > 1) sink[1] = 8.0f;   /* a sink that takes most of the denominator */
    for (int i = 0; i < c->R / 2; i++) freq[i] = powf(10000.0f, -(float)(2 * i) / (float)c->R);
}

/* ---- the reference ------------------------------------------------------------------------------------------------ */

/* out [H][D] for the query at p of sequence s; skip: a chunk of 64 key indices to leave out (-1: none). */
static void reference(const acase *c, const seqdata *s, int64_t p, const float *q, const int32_t *sel, int n_sel,
                      const float *sink, const float *freq, int skip, double *out) {
    const int D = c->D, H = c->H, R = c->R;
    const int64_t w0 = p - W + 1 > 0 ? p - W + 1 : 0;
    const int nwin = (int)(p - w0 + 1);
    const int nc = c->ratio == 128 ? (int)rows_needed(128, p) : c->ratio == 4 ? n_sel : 0;
    const int nk = nwin + nc;
    const float **keys = malloc(sizeof(float *) * (size_t)nk);
    double *sc = malloc(sizeof(double) * (size_t)nk);
    assert_true(keys && sc);
    for (int i = 0; i < nk; i++) {
        if (i < nwin) keys[i] = s->dpos + (w0 + i - s->base) * D;
        else keys[i] = s->drows + (int64_t)(c->ratio == 128 ? i - nwin : sel[i - nwin]) * D;
    }
    for (int h = 0; h < H; h++) {
        const float *qh = q + (int64_t)h * D;
        double mx = -INFINITY;
        for (int i = 0; i < nk; i++) {
            if (i / 64 == skip) continue;
            double d = 0;
            for (int j = 0; j < D; j++) d += (double)qh[j] * keys[i][j];
            sc[i] = d / sqrt((double)D);
            if (sc[i] > mx) mx = sc[i];
        }
        double den = exp((double)sink[h] - mx), *o = out + (int64_t)h * D;
        for (int j = 0; j < D; j++) o[j] = 0;
        for (int i = 0; i < nk; i++) {
            if (i / 64 == skip) continue;
            const double e = exp(sc[i] - mx);
            const double pe = c->official ? round_bf16((float)e) : e;
            den += e;
            for (int j = 0; j < D; j++) o[j] += pe * keys[i][j];
        }
        for (int j = 0; j < D; j++) {
            o[j] /= den;
            if (c->official) o[j] = round_bf16((float)o[j]);
        }
        for (int i = 0; i < R / 2; i++) {   /* de-rotation: theta = (float)p * freq[i], as the model computes it */
            const float theta = (float)p * freq[i];
            const double cs = cos((double)theta), sn = -sin((double)theta);
            double *x = o + D - R + 2 * i;
            const double re = x[0], im = x[1];
            x[0] = re * cs - im * sn;
            x[1] = re * sn + im * cs;
            if (c->official) { x[0] = round_bf16((float)x[0]); x[1] = round_bf16((float)x[1]); }
        }
    }
    free(keys);
    free(sc);
}

/* Worst over the heads of max |a - b| / max |b| (a head's outputs). */
static double worst_head_rel(const float *a, const double *b, int H, int D) {
    double worst = 0;
    for (int h = 0; h < H; h++) {
        double dm = 0, bm = 0;
        for (int j = 0; j < D; j++) {
            const double d = fabs((double)a[(int64_t)h * D + j] - b[(int64_t)h * D + j]);
            if (!(d <= dm)) dm = isnan(d) ? INFINITY : d;
            if (fabs(b[(int64_t)h * D + j]) > bm) bm = fabs(b[(int64_t)h * D + j]);
        }
        const double e = bm ? dm / bm : dm;
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

static double worst_head_rel_d(const double *a, const double *b, int H, int D) {
    float *f = malloc(sizeof(float) * (size_t)H * D);
    for (int64_t i = 0; i < (int64_t)H * D; i++) f[i] = (float)a[i];
    const double e = worst_head_rel(f, b, H, D);
    free(f);
    return e;
}

/* ---- one step on the device ------------------------------------------------------------------------------------- */

typedef struct {
    int seq;
    int64_t p0;
    int n;
} item_spec;

static int n_dec_compared;   /* steps whose outputs were compared with and without the decode-sized scores kernel */
static int n_dec_launches;   /* launches of those steps that took it (the others ran k_att_scores both times) */
static int n_fused_launches; /* launches of those steps that took k_att_dec, the one-launch decode attention */
static int n_mma_compared;   /* tensor-core steps compared with and without k_att_dec_mma */
static int n_mma_fused;      /* launches of those steps that took it */

/* Overwrites device memory d with NaN bytes (a kernel that writes nothing shows). */
static void dev_fill_nan(void *d, size_t n) {
    uint8_t *h = malloc(n ? n : 1);
    assert_non_null(h);
    memset(h, 0xff, n);
#ifdef ATT_TEST_EMULATE
    memcpy(d, h, n);
#else
    assert_int_equal(cu_upload(d, h, n), 0);
#endif
    free(h);
}

/* ATT_TEST_DUMP: every step's outputs, in the order the test runs them (the case's name before each). */
static void dump_outputs(const acase *c, const float *out, size_t n) {
    static FILE *f;
    static int tried;
    if (!tried) {
        tried = 1;
        const char *path = getenv("ATT_TEST_DUMP");
        if (path && *path && !(f = fopen(path, "ab"))) fail_msg("ATT_TEST_DUMP: cannot open %s", path);
    }
    if (!f) return;
    if (fprintf(f, "%s\n", c->name) < 0 || fwrite(out, sizeof(float), n, f) != n || fflush(f)) fail_msg("ATT_TEST_DUMP: write failed");
}

/* out [T][H][D]: cu_attention over the items (their tokens in order); scratch_floats 0: what a step allocates;
 * mma: cu_attention's tensor-core switch. */
static void run_step(const acase *c, int mma, seqdata *seqs, const item_spec *its, int n_items, int64_t scratch_floats, float *out) {
    const int H = c->H, D = c->D;
    kv_layout kl;
    kv_layout_init(&kl, c->fmt, KV_ROW_MAIN, D, c->R);
    const int64_t B = (int64_t)kl.bytes;
    int T = 0;
    for (int i = 0; i < n_items; i++) T += its[i].n;
    float *q = malloc(sizeof(float) * (size_t)T * H * D), *sink = malloc(sizeof(float) * (size_t)H), *freq = malloc(sizeof(float) * (size_t)(c->R / 2 + 1));
    uint8_t *kvs = malloc((size_t)(T * B));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)T);
    int32_t *item_of = malloc(sizeof(int32_t) * (size_t)T), *sel = calloc((size_t)T * TOPK, sizeof(int32_t)), *n_sel = malloc(sizeof(int32_t) * (size_t)T);
    cu_item *items = malloc(sizeof(cu_item) * (size_t)n_items);
    cu_seq_layer *sl = calloc((size_t)n_items, sizeof(cu_seq_layer));
    assert_true(q && sink && freq && kvs && pos && item_of && sel && n_sel && items && sl);
    heads_of(c, sink, freq);
    int64_t max_keys = W;
    for (int i = 0, t = 0; i < n_items; i++) {
        const seqdata *s = &seqs[its[i].seq];
        items[i] = (cu_item){ t, its[i].n, its[i].p0 };
        sl[i].ring = s->d_ring;
        sl[i].crows = s->d_crows;
        for (int k = 0; k < its[i].n; k++, t++) {
            const int64_t p = its[i].p0 + k;
            assert_true(p >= s->base && p <= s->last);
            pos[t] = p;
            item_of[t] = i;
            memcpy(kvs + t * B, s->pos_rows + (p - s->base) * B, (size_t)B);
            query_of(c, its[i].seq, p, q + (int64_t)t * H * D);
            n_sel[t] = sel_of(c, its[i].seq, p, sel + (int64_t)t * TOPK);
            const int64_t nk = (p + 1 < W ? p + 1 : W) + (c->ratio == 128 ? rows_needed(128, p) : n_sel[t]);
            if (nk > max_keys) max_keys = nk;
        }
    }
    if (!scratch_floats) scratch_floats = cu_attention_scratch_floats(T, H, D, max_keys);
    float *d_q = dev_put(q, sizeof(float) * (size_t)T * H * D), *d_sink = dev_put(sink, sizeof(float) * (size_t)H);
    float *d_freq = dev_put(freq, sizeof(float) * (size_t)(c->R / 2 + 1));
    uint8_t *d_kvs = dev_put(kvs, (size_t)(T * B));
    int64_t *d_pos = dev_put(pos, sizeof(int64_t) * (size_t)T);
    int32_t *d_item_of = dev_put(item_of, sizeof(int32_t) * (size_t)T), *d_sel = dev_put(sel, sizeof(int32_t) * (size_t)T * TOPK);
    int32_t *d_n_sel = dev_put(n_sel, sizeof(int32_t) * (size_t)T);
    cu_item *d_items = dev_put(items, sizeof(cu_item) * (size_t)n_items);
    cu_seq_layer *d_sl = dev_put(sl, sizeof(cu_seq_layer) * (size_t)n_items);
    float *d_scratch = dev_put(NULL, sizeof(float) * (size_t)scratch_floats);
    float *d_o = dev_put(NULL, sizeof(float) * (size_t)T * H * D);
    const cu_kvlay lay = { kl.fmt, kl.kind, kl.width, kl.rope, kl.nope, (int)kl.bytes };
    static const unsigned zero2[2] = { 0, 0 };
    unsigned *d_bar = dev_put(zero2, sizeof zero2), bar[2];   /* k_att_dec's grid-barrier words */
    const int rc = cu_attention(NULL, c->official, mma ? CU_ATT_MMA : 0, lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, RING, W, c->ratio,
                                d_sel, d_n_sel, TOPK, d_sink, d_freq, T, H, D, c->R, (int)max_keys, d_scratch, scratch_floats, d_bar, d_o);
    if (rc) fail_msg("%s: cu_attention refused %lld keys with a scratch of %lld floats", c->name, (long long)max_keys, (long long)scratch_floats);
    dev_sync();
    dev_get(out, d_o, sizeof(float) * (size_t)T * H * D);
    {   /* the same step again on its path's other kernels: the same bits (memcmp). CUDA cores: without the one-launch
         * kernel, then without either decode-sized kernel; tensor cores: without their one-launch kernel */
        const int fused = cu_attention_fused_launches(c->official, mma ? CU_ATT_MMA : 0, lay, T, H, D, (int)max_keys, scratch_floats);
        dev_get(bar, d_bar, sizeof bar);
#ifndef ATT_TEST_SHIM   /* the shim runs k_att_dec's steps as three launches, without barriers */
        if (bar[0] != 0 || bar[1] != 2u * (unsigned)fused)
            fail_msg("%s: after %d launches of k_att_dec the barrier words are %u, %u (want 0, %u)", c->name, fused, bar[0], bar[1], 2u * (unsigned)fused);
#endif
        static const struct { int flags; const char *what; } others[3] = {
            { CU_ATT_NO_FUSED, "k_att_dec differs from k_att_scores_dec + k_att_pv + k_att_combine" },
            { CU_ATT_NO_DEC, "the decode-sized kernels differ from k_att_scores + k_att_pv + k_att_combine" },
            { CU_ATT_MMA | CU_ATT_NO_DEC_MMA, "k_att_dec_mma differs from k_att_scores_mma + k_att_pv_mma + k_att_combine" } };
        float *old = malloc(sizeof(float) * (size_t)T * H * D);
        assert_non_null(old);
        for (int k = mma ? 2 : 0; k < (mma ? 3 : 2); k++) {
            dev_fill_nan(d_o, sizeof(float) * (size_t)T * H * D);
            dev_fill_nan(d_scratch, sizeof(float) * (size_t)scratch_floats);   /* nothing may come from the run before */
            if (cu_attention(NULL, c->official, others[k].flags, lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, RING, W, c->ratio, d_sel,
                             d_n_sel, TOPK, d_sink, d_freq, T, H, D, c->R, (int)max_keys, d_scratch, scratch_floats, d_bar, d_o))
                fail_msg("%s: cu_attention (flags %d) refused the step", c->name, others[k].flags);
            dev_sync();
            dev_get(old, d_o, sizeof(float) * (size_t)T * H * D);
            if (memcmp(old, out, sizeof(float) * (size_t)T * H * D)) {
                int64_t first = 0;
                while (!memcmp(old + first, out + first, sizeof(float))) first++;
                fail_msg("%s: %d queries: %s (first at output %lld: %a vs %a)", c->name, T, others[k].what, (long long)first, out[first],
                         old[first]);
            }
        }
        if (mma) {
            n_mma_compared++;
            n_mma_fused += fused;
        } else {
            n_dec_compared++;
            n_dec_launches += cu_attention_decode_launches(c->official, 0, lay, T, H, D, (int)max_keys, scratch_floats);
            n_fused_launches += fused;
        }
        free(old);
    }
    dev_free(d_bar);
    dump_outputs(c, out, (size_t)T * H * D);
    dev_free(d_q); dev_free(d_sink); dev_free(d_freq); dev_free(d_kvs); dev_free(d_pos); dev_free(d_item_of); dev_free(d_sel);
    dev_free(d_n_sel); dev_free(d_items); dev_free(d_sl); dev_free(d_scratch); dev_free(d_o);
    free(q); free(sink); free(freq); free(kvs); free(pos); free(item_of); free(sel); free(n_sel); free(items); free(sl);
}

/* Checks the GPU's output of the query (seq, p) against the reference; returns the error. */
static double check_query(const acase *c, const seqdata *seqs, int seq, int64_t p, const float *gpu, double *sensitivity) {
    const int H = c->H, D = c->D;
    float *q = malloc(sizeof(float) * (size_t)H * D), *sink = malloc(sizeof(float) * (size_t)H), *freq = malloc(sizeof(float) * (size_t)(c->R / 2 + 1));
    int32_t *sel = malloc(sizeof(int32_t) * TOPK);
    double *ref = malloc(sizeof(double) * (size_t)H * D);
    assert_true(q && sink && freq && sel && ref);
    query_of(c, seq, p, q);
    heads_of(c, sink, freq);
    const int n_sel = sel_of(c, seq, p, sel);
    reference(c, &seqs[seq], p, q, sel, n_sel, sink, freq, -1, ref);
    const double e = worst_head_rel(gpu, ref, H, D);
    if (c->official)
        for (int64_t i = 0; i < (int64_t)H * D; i++)
            if (round_bf16(gpu[i]) != gpu[i]) fail_msg("%s: OFFICIAL output %lld (%g) is not a bf16 value", c->name, (long long)i, gpu[i]);
    if (sensitivity) {   /* the same without the key chunk 1 (keys 64..127) */
        double *ref2 = malloc(sizeof(double) * (size_t)H * D);
        reference(c, &seqs[seq], p, q, sel, n_sel, sink, freq, 1, ref2);
        *sensitivity = worst_head_rel_d(ref2, ref, H, D);
        free(ref2);
    }
    free(q); free(sink); free(freq); free(sel); free(ref);
    return e;
}

/* One path (mma: tensor cores) of a case: alone = in a step = in groups, against the reference. Returns the alone
 * query's outputs (malloc'd). */
static float *run_path(const acase *c, int mma, seqdata *seqs) {
    const int H = c->H, D = c->D;
    const char *path = !c->official ? "" : mma ? " [tensor cores]" : " [CUDA cores]";
    const int64_t HD = (int64_t)H * D;
    float *alone = malloc(sizeof(float) * (size_t)HD), *batch = malloc(sizeof(float) * (size_t)(2 * STEP * HD));
    float *grouped = malloc(sizeof(float) * (size_t)(2 * STEP * HD));
    assert_true(alone && batch && grouped);
    /* decode: the query alone, its window (but itself) from the ring */
    const item_spec one = { 0, c->P, 1 };
    run_step(c, mma, seqs, &one, 1, 0, alone);
    /* a step: the short sequence's last STEP tokens, then the long one's (its window's last keys from the step) */
    const item_spec two[2] = { { 1, c->Q - STEP + 1, STEP }, { 0, c->P - STEP + 1, STEP } };
    run_step(c, mma, seqs, two, 2, 0, batch);
    /* the same step in groups of two queries */
    const int64_t max_keys = W + (c->ratio == 128 ? rows_needed(128, c->P) : c->ratio == 4 ? TOPK : 0);
    const int64_t per_query = cu_attention_scratch_floats(1, H, D, max_keys);
    run_step(c, mma, seqs, two, 2, 2 * per_query, grouped);
    if (memcmp(alone, batch + (int64_t)(2 * STEP - 1) * HD, sizeof(float) * (size_t)HD))
        fail_msg("%s%s: the query at %lld differs alone and in a step", c->name, path, (long long)c->P);
    if (memcmp(batch, grouped, sizeof(float) * (size_t)(2 * STEP * HD)))
        fail_msg("%s%s: the step differs when its queries run in groups of two", c->name, path);
    double sens = 0;
    const double tol = c->official ? OFFICIAL_TOL : EXACT_TOL;
    const double e_alone = check_query(c, seqs, 0, c->P, alone, &sens);
    double e_step = check_query(c, seqs, 0, c->P - STEP + 1, batch + (int64_t)STEP * HD, NULL);
    for (int k = 0; k < STEP; k++) {
        const double e = check_query(c, seqs, 1, c->Q - STEP + 1 + k, batch + (int64_t)k * HD, NULL);
        if (e > e_step) e_step = e;
    }
    const int64_t nk = (c->P + 1 < W ? c->P + 1 : W) + (c->ratio == 128 ? rows_needed(128, c->P) : c->ratio == 4 ? TOPK : 0);
    printf("  %-34s %6lld keys%s: vs double reference %.3g (alone), %.3g (step); alone = in a step = in groups (memcmp); "
           "one chunk less: %.3g\n", c->name, (long long)nk, path, e_alone, e_step, sens);
    if (!(e_alone <= tol) || !(e_step <= tol))
        fail_msg("%s%s: relative error %.3g / %.3g against the reference > %g", c->name, path, e_alone, e_step, tol);
    /* OFFICIAL's tolerance is a bf16 step or so: a lost chunk shows where the keys are few enough (CSA, window) */
    if (!c->official ? !(sens > 20 * tol) : nk <= 1024 && !(sens > 5 * tol))
        fail_msg("%s%s: the test cannot see a lost chunk (%.3g, tolerance %g)", c->name, path, sens, tol);
    free(batch); free(grouped);
    return alone;
}

static void run_case(const acase *c) {
    kv_layout kl;
    kv_layout_init(&kl, c->fmt, KV_ROW_MAIN, c->D, c->R);
    seqdata seqs[2];
    seq_make(&seqs[0], &kl, c->ratio, c->P, 1000 + (uint64_t)c->ratio);
    seq_make(&seqs[1], &kl, c->ratio, c->Q, 2000 + (uint64_t)c->ratio);
    float *cores = run_path(c, 0, seqs);
    if (c->official) {   /* the same on tensor cores; the paths differ in the summation only */
        float *tc = run_path(c, 1, seqs);
        double worst = 0;
        int64_t differ = 0;
        for (int64_t i = 0; i < (int64_t)c->H * c->D; i++) {
            const double d = fabs((double)tc[i] - cores[i]) / (fabs((double)cores[i]) > 1e-30 ? fabs((double)cores[i]) : 1e-30);
            differ += tc[i] != cores[i];
            if (!(d <= worst)) worst = d;
        }
        printf("  %-34s tensor cores vs CUDA cores (alone): %lld of %lld outputs differ, by at most %.3g relative\n", "",
               (long long)differ, (long long)c->H * c->D, worst);
        free(tc);
    }
    free(cores);
    seq_free(&seqs[0]);
    seq_free(&seqs[1]);
}

/* p + 1 = 20,000 x 128 + 51: 20,000 ratio-128 rows (315 chunks of 64 keys with the window); 3,000 in the CPU
 * shim's quick run (tools/gpu/shim/shim_attention.sh) */
#ifdef ATT_TEST_QUICK
#define P_HCA (3000LL * 128 + 50)
#else
#define P_HCA (20000LL * 128 + 50)
#endif

static void hca_20000_rows(void **state) {
    (void)state;
    const acase c = { "HCA 64 x 512, f32 KV, EXACT", 64, 512, 64, DSV4_KV_F32, 128, 0, P_HCA, 700 };
    run_case(&c);
}

static void hca_fp8_official(void **state) {
    (void)state;
    const acase c = { "HCA 64 x 512, fp8 KV, OFFICIAL", 64, 512, 64, DSV4_KV_FP8, 128, 1, P_HCA, 700 };
    run_case(&c);
}

static void csa_top512(void **state) {
    (void)state;
    const acase c1 = { "CSA top-512 64 x 512, bf16 KV, EXACT", 64, 512, 64, DSV4_KV_BF16, 4, 0, 80003, 40 };
    run_case(&c1);
    const acase c2 = { "CSA top-512 64 x 512, fp8, OFFICIAL", 64, 512, 64, DSV4_KV_FP8, 4, 1, 80003, 40 };
    run_case(&c2);
}

static void window_and_odd_shapes(void **state) {
    (void)state;
    const acase c1 = { "window 64 x 512, f32 KV, EXACT", 64, 512, 64, DSV4_KV_F32, 0, 0, 5000, 60 };
    run_case(&c1);
    const acase c2 = { "HCA 70 x 96 (R 32), fp8 KV, EXACT", 70, 96, 32, DSV4_KV_FP8, 128, 0, 3000 * 128 + 7, 300 };
    run_case(&c2);
    /* OFFICIAL (both paths): a window of bf16 rows; 70 heads (a partial head group, a partial 16-head tile) of 88
     * columns (not a multiple of 16: a k-step with zero columns; partial column slices) */
    const acase c3 = { "window 64 x 512, bf16 KV, OFFICIAL", 64, 512, 64, DSV4_KV_BF16, 0, 1, 5000, 60 };
    run_case(&c3);
    const acase c4 = { "CSA 70 x 88 (R 24), fp8 KV, OFFICIAL", 70, 88, 24, DSV4_KV_FP8, 4, 1, 9003, 40 };
    run_case(&c4);
}

/* Decode-sized steps: 1 to 4 queries of the two sequences (the long one at P, P - 1; the short one at Q, Q - 1),
 * each query's outputs in every step memcmp-equal to its outputs alone, and alone against the reference. */
static void decode_case(const acase *c) {
    const int64_t HD = (int64_t)c->H * c->D;
    kv_layout kl;
    kv_layout_init(&kl, c->fmt, KV_ROW_MAIN, c->D, c->R);
    seqdata seqs[2];
    seq_make(&seqs[0], &kl, c->ratio, c->P, 3000 + (uint64_t)c->ratio);
    seq_make(&seqs[1], &kl, c->ratio, c->Q, 4000 + (uint64_t)c->ratio);
    for (int mma = 0; mma <= c->official; mma++) {
        const char *path = !c->official ? "" : mma ? " [tensor cores]" : " [CUDA cores]";
        /* alone: queries (seq 0, P - 1), (0, P), (1, Q - 1), (1, Q) */
        float *alone = malloc(sizeof(float) * (size_t)(4 * HD)), *out = malloc(sizeof(float) * (size_t)(4 * HD));
        assert_true(alone && out);
        const int64_t apos[4] = { c->P - 1, c->P, c->Q - 1, c->Q };
        double worst = 0;
        for (int k = 0; k < 4; k++) {
            const item_spec one = { k / 2, apos[k], 1 };
            run_step(c, mma, seqs, &one, 1, 0, alone + k * HD);
            const double e = check_query(c, seqs, k / 2, apos[k], alone + k * HD, NULL);
            if (!(e <= worst)) worst = e;
        }
        const double tol = c->official ? OFFICIAL_TOL : EXACT_TOL;
        if (!(worst <= tol)) fail_msg("%s%s: relative error %.3g against the reference > %g", c->name, path, worst, tol);
        /* steps of 2, 3 and 4 queries: which alone output each of their queries must equal */
        const item_spec s2[2] = { { 0, c->P, 1 }, { 1, c->Q, 1 } }, s3[2] = { { 1, c->Q - 1, 2 }, { 0, c->P, 1 } };
        const item_spec s4[2] = { { 0, c->P - 1, 2 }, { 1, c->Q - 1, 2 } };
        const struct { const item_spec *its; int n_items, T; int want[4]; } steps[3] = {
            { s2, 2, 2, { 1, 3 } }, { s3, 2, 3, { 2, 3, 1 } }, { s4, 2, 4, { 0, 1, 2, 3 } } };
        for (int st = 0; st < 3; st++) {
            run_step(c, mma, seqs, steps[st].its, steps[st].n_items, 0, out);
            for (int t = 0; t < steps[st].T; t++)
                if (memcmp(out + t * HD, alone + steps[st].want[t] * HD, sizeof(float) * (size_t)HD))
                    fail_msg("%s%s: query %d of a %d-query step differs from the same query alone", c->name, path, t, steps[st].T);
        }
        int64_t nk[4];
        for (int k = 0; k < 4; k++) {
            int32_t sel[TOPK];
            nk[k] = (apos[k] + 1 < W ? apos[k] + 1 : W) + (c->ratio == 128 ? rows_needed(128, apos[k]) : sel_of(c, k / 2, apos[k], sel));
        }
        printf("  %-34s %lld/%lld/%lld/%lld keys%s: vs double reference %.3g; steps of 2, 3, 4 queries = alone (memcmp)\n", c->name,
               (long long)nk[0], (long long)nk[1], (long long)nk[2], (long long)nk[3], path, worst);
        free(alone);
        free(out);
    }
    seq_free(&seqs[0]);
    seq_free(&seqs[1]);
}

static void decode_shapes(void **state) {
    (void)state;
    /* P, Q: the long and the short sequence's query positions (each also at P - 1, Q - 1) */
    static const acase cases[] = {
        { "decode window 64 x 512, fp8, OFFICIAL", 64, 512, 64, DSV4_KV_FP8, 0, 1, 64, 62 },          /* 64/65, 62/63 keys */
        { "decode HCA 64 x 512, bf16, EXACT", 64, 512, 64, DSV4_KV_BF16, 128, 0, 8319, 300 },        /* 192/193, 130 */
        { "decode HCA 64 x 512, fp8, EXACT", 64, 512, 64, DSV4_KV_FP8, 128, 0, 8319, 200 },          /* 192/193, 129/129 */
        { "decode CSA 64 x 512, fp8, OFFICIAL", 64, 512, 64, DSV4_KV_FP8, 4, 1, 259, 100 },          /* 192/193, 125/126 */
        { "decode CSA 64 x 512, bf16, OFFICIAL", 64, 512, 64, DSV4_KV_BF16, 4, 1, 255, 63 },         /* 191/192, 78/80 */
        { "decode window 8 x 96 (R 32), bf16, EXACT", 8, 96, 32, DSV4_KV_BF16, 0, 0, 200, 70 },       /* 128, 70/71 */
        { "decode CSA 20 x 88 (R 24), fp8, OFFICIAL", 20, 88, 24, DSV4_KV_FP8, 4, 1, 259, 100 },      /* 192/193, 125/126 */
        { "decode CSA 64 x 512, f32, OFFICIAL", 64, 512, 64, DSV4_KV_F32, 4, 1, 259, 100 },          /* f32 rows: copied, not decoded */
        { "decode HCA 64 x 512, f32, EXACT", 64, 512, 64, DSV4_KV_F32, 128, 0, 8319, 300 },
        { "decode window 8 x 96 (R 32), f32, OFFICIAL", 8, 96, 32, DSV4_KV_F32, 0, 1, 200, 70 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int before = n_dec_launches;
        decode_case(&cases[i]);
#if !defined(ATT_TEST_EMULATE) || defined(ATT_TEST_SHIM)
        if (cases[i].fmt == DSV4_KV_F32 && n_dec_launches == before)   /* f32 rows fit since they need no raw copy */
            fail_msg("%s: the decode-sized scores kernel never ran", cases[i].name);
#endif
    }
}

/* Every step above of the CUDA-core path ran three times, with and without the decode-sized kernels, and every step
 * of the tensor-core path twice, with and without k_att_dec_mma, and each gave the same bits (run_step's memcmp); the
 * kernels must have run in some of them (launches whose blocks fit in one wave: the decode shapes, the groups of two). */
static void decode_kernel_compared(void **state) {
    (void)state;
    printf("  decode-sized kernels = k_att_scores (memcmp of the outputs): %d steps, %d launches of k_att_scores_dec, %d of k_att_dec\n",
           n_dec_compared, n_dec_launches, n_fused_launches);
    printf("  tensor cores: k_att_dec_mma = k_att_scores_mma + k_att_pv_mma + k_att_combine (memcmp): %d steps, %d launches of k_att_dec_mma\n",
           n_mma_compared, n_mma_fused);
    assert_true(n_dec_compared > 0);
    assert_true(n_mma_compared > 0);
#if !defined(ATT_TEST_EMULATE) || defined(ATT_TEST_SHIM)
    assert_true(n_dec_launches > 0);
    assert_true(n_fused_launches > 0);
    assert_true(n_mma_fused > 0);
#endif
}

#ifndef ATT_TEST_EMULATE
/* ---- benchmark (GPU): `test_gpu_attention --bench` ---------------------------------------------------------------
 * cu_attention at decode shapes (V4-Flash: 64 heads x 512, R 64, fp8 rows, OFFICIAL on CUDA cores): T queries of
 * one sequence each (items of one token) over a window of 128 (SWA), + 512 selected rows (CSA) or + 512 ratio-128
 * rows (HCA); microseconds a call (its three kernels, back to back on one stream) with the decode-sized scores
 * kernel where cu_attention takes it ("dec" = its launches) and without it (CU_ATT_NO_DEC), after checking the two
 * give the same bits. The scratch is sized for 16 queries of 640 keys in every row: 10 chunks' blocks a query. */
#include <cuda_runtime.h>

/* GPU microseconds a call: CALLS calls captured in one CUDA graph (as a decode step runs them: no host work between
 * the kernels), the graph replayed reps / CALLS times between two events; 3 direct calls first to warm up. -1 when a
 * call or the capture fails. */
static double us_per_call(int mode, const cu_kvlay *lay, float *d_q, uint8_t *d_kvs, int64_t *d_pos, int32_t *d_item_of, cu_item *d_items,
                          cu_seq_layer *d_sl, int ratio, int32_t *d_sel, int32_t *d_n_sel, float *d_sink, float *d_freq, int T,
                          int max_keys, float *d_scratch, int64_t sf, unsigned *d_bar, float *d_o, int reps) {
    enum { CALLS = 20 };
    cudaStream_t st;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t e0, e1;
    float ms = -1;
    int bad = 0;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return -1;
    for (int r = 0; r < 3 && !bad; r++)   /* warm */
        bad = cu_attention((cu_stream)st, 1, mode, *lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, RING, W, ratio, d_sel, d_n_sel, TOPK, d_sink,
                           d_freq, T, 64, 512, 64, max_keys, d_scratch, sf, d_bar, d_o);
    if (!bad && cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
        for (int r = 0; r < CALLS; r++)
            bad |= cu_attention((cu_stream)st, 1, mode, *lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, RING, W, ratio, d_sel, d_n_sel, TOPK,
                                d_sink, d_freq, T, 64, 512, 64, max_keys, d_scratch, sf, d_bar, d_o);
        bad |= cudaStreamEndCapture(st, &graph) != cudaSuccess || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess;
    } else
        bad = 1;
    if (!bad) {
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaGraphLaunch(exec, st);   /* warm */
        cudaEventRecord(e0, st);
        for (int r = 0; r < reps / CALLS; r++) cudaGraphLaunch(exec, st);
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamSynchronize(st);
    cudaStreamDestroy(st);
    return !bad && cudaGetLastError() == cudaSuccess ? ms * 1e3 / (reps / CALLS * CALLS) : -1;
}

/* ---- `test_gpu_attention --times` (a -DATT_BLOCK_TIMES=1 build: tools/gpu/stage_times.sh) ---------------------------
 * Where a decode attention kernel's time goes, from the kernels' own records of each warp (k_attention.cu att_times):
 * per launch, the gap between the launch before it ending and its first block starting, the spread of its blocks'
 * starts, their durations (median, longest), the launch's span, and when the median busy block's last warp passed
 * each mark (k_att_pv: 0 row addresses, 1 M_h, 2 e, 3 the slice's rows; k_att_scores_dec: 0 row addresses (q's
 * copies issued), 1 the copies landed, 2 rows decoded; k_att_dec and k_att_dec_mma: 0 scores, 1 barrier, 2 P.V,
 * 3 barrier); means over a call graph's last 20 launches of each kernel. */
static int time_cmp(const void *a, const void *b) {
    const cu_att_time *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}
static int block_cmp(const void *a, const void *b) {
    const cu_att_time *x = a, *y = b;
    return x->block < y->block ? -1 : x->block > y->block;
}
static int u64_cmp(const void *a, const void *b) {
    const unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}
static int bench(int times, const char *only);
static unsigned long long rec_end(const cu_att_time *r) { return r->end > r->start ? r->end : r->start; }

/* One launch's records (n warps): its blocks' [start, end) and marks (the last warp's), in b; returns the count. */
typedef struct {
    unsigned long long start, end, mark[4];
} block_time;
static int launch_blocks(cu_att_time *rec, int n, block_time *b) {
    qsort(rec, (size_t)n, sizeof *rec, block_cmp);
    int nb = 0;
    for (int i = 0; i < n; i++) {
        if (!i || rec[i].block != rec[i - 1].block) b[nb++] = (block_time){ rec[i].start, rec_end(&rec[i]), { 0, 0, 0, 0 } };
        block_time *x = &b[nb - 1];
        if (rec[i].start < x->start) x->start = rec[i].start;
        if (rec_end(&rec[i]) > x->end) x->end = rec_end(&rec[i]);
        for (int m = 0; m < 4; m++) if (rec[i].mark[m] > x->mark[m]) x->mark[m] = rec[i].mark[m];
    }
    return nb;
}

static void times_report(const char *what, cu_att_time *rec, int n) {
    static const char *const names[] = { "?", "k_att_scores_dec", "k_att_pv", "k_att_combine", "k_att_dec", "scores_dec again", "k_att_dec_mma" };
    enum { LAST = 20 };
    {   /* the SMs' clock rate while the warps ran: cycles / ns of the warps that ran 2 us or more */
        double *ghz = malloc(sizeof(double) * (size_t)n);
        int m = 0;
        for (int i = 0; i < n; i++)
            if (rec[i].end > rec[i].start + 2000 && rec[i].clk_end > rec[i].clk_start)
                ghz[m++] = (double)(rec[i].clk_end - rec[i].clk_start) / (double)(rec[i].end - rec[i].start);
        double lo = 1e9, hi = 0, sum = 0;
        for (int i = 0; i < m; i++) lo = ghz[i] < lo ? ghz[i] : lo, hi = ghz[i] > hi ? ghz[i] : hi, sum += ghz[i];
        if (m) printf("%-24s SM clock %.3f GHz (%.3f .. %.3f, %d warps)\n", what, sum / m, lo, hi, m);
        free(ghz);
    }
    qsort(rec, (size_t)n, sizeof *rec, time_cmp);
    /* launches: runs of one kernel that do not overlap the launch before (plain captured launches never do) and
     * begin 1 us or more after its first block (a launch's blocks start within ~0.1 us; without that rule a launch
     * whose first-sorted warps have no keys and end at once was cut in two, run 83) */
    int *first = malloc(sizeof(int) * (size_t)(n + 1)), nl = 0;
    unsigned long long *v = malloc(sizeof(unsigned long long) * (size_t)n), *lend = malloc(sizeof(unsigned long long) * (size_t)(n + 1));
    block_time *bt = malloc(sizeof(block_time) * (size_t)n);
    unsigned long long seg_end = 0;
    for (int i = 0; i < n; i++) {
        if (!nl || rec[i].kernel != rec[first[nl - 1]].kernel || (rec[i].start > seg_end && rec[i].start > rec[first[nl - 1]].start + 1000)) {
            if (nl) lend[nl - 1] = seg_end;
            first[nl++] = i, seg_end = 0;
        }
        if (rec_end(&rec[i]) > seg_end) seg_end = rec_end(&rec[i]);
    }
    if (nl) lend[nl - 1] = seg_end;
    first[nl] = n;
    /* kernel 5: a k_att_scores_dec launch right after another (cu_att_block_times_twice) */
    unsigned *kid = malloc(sizeof(unsigned) * (size_t)(nl + 1));
    for (int l = 0; l < nl; l++) kid[l] = l && rec[first[l]].kernel == 1 && rec[first[l - 1]].kernel == 1 ? 5 : rec[first[l]].kernel;
    for (unsigned k = 1; k <= 6; k++) {
        double gap = 0, spread = 0, med = 0, mx = 0, span = 0, blocks = 0, busy = 0, mk[4] = { 0, 0, 0, 0 };
        int counted = 0;
        for (int l = nl - 1; l >= 1 && counted < LAST; l--) {
            if (kid[l] != k) continue;
            const unsigned long long t0 = rec[first[l]].start;
            const int nb = launch_blocks(rec + first[l], first[l + 1] - first[l], bt);
            unsigned long long last_start = 0;
            int m = 0;
            for (int i = 0; i < nb; i++) {
                if (bt[i].start > last_start) last_start = bt[i].start;
                if (bt[i].end > bt[i].start) v[m++] = bt[i].end - bt[i].start;
            }
            qsort(v, (size_t)m, sizeof *v, u64_cmp);
            gap += (double)(t0 - lend[l - 1]) / 1e3;
            spread += (double)(last_start - t0) / 1e3;
            med += m ? (double)v[m / 2] / 1e3 : 0;
            mx += m ? (double)v[m - 1] / 1e3 : 0;
            span += (double)(lend[l] - t0) / 1e3;
            blocks += nb;
            busy += m;
            for (int mm = 0; mm < 4; mm++) {
                int q = 0;
                for (int i = 0; i < nb; i++) if (bt[i].end > bt[i].start && bt[i].mark[mm]) v[q++] = bt[i].mark[mm] - bt[i].start;
                qsort(v, (size_t)q, sizeof *v, u64_cmp);
                mk[mm] += q ? (double)v[q / 2] / 1e3 : 0;
            }
            counted++;
        }
        if (counted)
            printf("%-24s %-16s %5.0f %5.0f %7.2f %7.2f %7.2f %7.2f %7.2f %6.2f %6.2f %6.2f %6.2f\n", what, names[k], blocks / counted,
                   busy / counted, gap / counted, spread / counted, med / counted, mx / counted, span / counted, mk[0] / counted,
                   mk[1] / counted, mk[2] / counted, mk[3] / counted);
    }
    free(first);
    free(kid);
    free(v);
    free(lend);
    free(bt);
}

static int times_main(void) {
    if (cu_att_block_times(NULL, 0) < 0) {
        fprintf(stderr, "test_gpu_attention --times needs a -DATT_BLOCK_TIMES=1 build (tools/gpu/stage_times.sh)\n");
        return 1;
    }
    return bench(1, NULL);
}

/* only: "swa", "csa" or "hca" runs that kind alone (e.g. so that ncu's --launch-skip lands on a launch whose blocks
 * all have keys: a window-only query leaves 64 of the 80 blocks of a 640-key launch without any, run 80) */
static int bench(int times, const char *only) {
    enum { H = 64, D = 512, R = 64, TMAX = 16, NROWS = 4096 };
    kv_layout kl;
    kv_layout_init(&kl, DSV4_KV_FP8, KV_ROW_MAIN, D, R);
    const cu_kvlay lay = { kl.fmt, kl.kind, kl.width, kl.rope, kl.nope, (int)kl.bytes };
    const int64_t B = (int64_t)kl.bytes, P = 65535;   /* (P + 1) / 128 = 512 HCA rows */
    dsv4_rng r;
    dsv4_rng_seed(&r, 99);
    float mu[D];
    for (int j = 0; j < D; j++) mu[j] = 0.3f * urand(&r);
    uint8_t *ring = malloc((size_t)(TMAX * RING * B)), *rows = malloc((size_t)(NROWS * B)), *kvs = malloc((size_t)(TMAX * B));
    float *q = malloc(sizeof(float) * TMAX * H * D), sink[H], freq[R / 2];
    int64_t pos[TMAX];
    int32_t item_of[TMAX], *sel = malloc(sizeof(int32_t) * TMAX * TOPK), n_sel[TMAX];
    cu_item items[TMAX];
    cu_seq_layer sl[TMAX];
    if (!ring || !rows || !kvs || !q || !sel) return 1;
    for (int64_t i = 0; i < TMAX * RING; i++) gen_row(&r, &kl, mu, ring + i * B);
    for (int64_t i = 0; i < NROWS; i++) gen_row(&r, &kl, mu, rows + i * B);
    for (int t = 0; t < TMAX; t++) gen_row(&r, &kl, mu, kvs + t * B);
    for (int64_t i = 0; i < (int64_t)TMAX * H * D; i++) q[i] = round_bf16(urand(&r));
    for (int h = 0; h < H; h++) sink[h] = urand(&r);
    for (int i = 0; i < R / 2; i++) freq[i] = powf(10000.0f, -(float)(2 * i) / (float)R);
    uint8_t *d_ring = dev_put(ring, (size_t)(TMAX * RING * B)), *d_rows = dev_put(rows, (size_t)(NROWS * B)), *d_kvs = dev_put(kvs, (size_t)(TMAX * B));
    for (int t = 0; t < TMAX; t++) {
        pos[t] = P;
        item_of[t] = t;
        items[t] = (cu_item){ t, 1, P };
        memset(&sl[t], 0, sizeof sl[t]);
        sl[t].ring = d_ring + (int64_t)t * RING * B;
        sl[t].crows = d_rows;
        n_sel[t] = TOPK;
        for (int k = 0; k < TOPK; k++) sel[t * TOPK + k] = (int32_t)(k * 8 + (int)dsv4_rng_below(&r, 8));   /* spread over 4096 rows */
    }
    float *d_q = dev_put(q, sizeof(float) * TMAX * H * D), *d_sink = dev_put(sink, sizeof sink), *d_freq = dev_put(freq, sizeof freq);
    int64_t *d_pos = dev_put(pos, sizeof pos);
    int32_t *d_item_of = dev_put(item_of, sizeof item_of), *d_sel = dev_put(sel, sizeof(int32_t) * TMAX * TOPK), *d_n_sel = dev_put(n_sel, sizeof n_sel);
    cu_item *d_items = dev_put(items, sizeof items);
    cu_seq_layer *d_sl = dev_put(sl, sizeof sl);
    const int max_keys = W + TOPK;
    const int64_t sf = cu_attention_scratch_floats(TMAX, H, D, max_keys);
    float *d_scratch = dev_put(NULL, sizeof(float) * (size_t)sf), *d_o = dev_put(NULL, sizeof(float) * TMAX * H * D);
    static const unsigned zero2[2] = { 0, 0 };
    unsigned *d_bar = dev_put(zero2, sizeof zero2);
    float *o_new = malloc(sizeof(float) * TMAX * H * D), *o_old = malloc(sizeof(float) * TMAX * H * D);
    float *o_mid = malloc(sizeof(float) * TMAX * H * D);
    static const struct { const char *name; int ratio; } kinds[] = { { "SWA (128 keys)", 0 }, { "CSA (128 + 512)", 4 }, { "HCA (128 + 512)", 128 } };
    static const int Ts[] = { 1, 2, 4, 8, 16 };
    if (times) {
        enum { MAXREC = 1 << 18 };
        cu_att_time *rec = malloc(sizeof *rec * MAXREC);
        char what[64];
        if (!rec) return 1;
        printf("one query, fp8 rows, 64 x 512; a launch's blocks (us, %%globaltimer): mean over the last 20 launches of a call graph\n");
        printf("%-24s %-16s %5s %5s %7s %7s %7s %7s %7s %6s %6s %6s %6s\n", "call", "kernel", "blocks", "busy", "gap", "spread", "median",
               "longest", "span", "mark0", "mark1", "mark2", "mark3");
        for (int twice = 0; twice < 2; twice++) {   /* then k_att_scores_dec twice in a row: is its second run faster? */
            if (cu_att_block_times_twice(twice)) {
                fprintf(stderr, "times: cu_att_block_times_twice failed\n");
                return 1;
            }
            for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
                for (int fused = 0; fused < 3 - 2 * twice; fused++) {   /* the fused kernels have no k_att_scores_dec; 2: k_att_dec_mma */
                    if (cu_att_block_times(rec, MAXREC) < 0) return 1;   /* clears */
                    const double us = us_per_call(fused == 2 ? CU_ATT_MMA : fused ? 0 : CU_ATT_NO_FUSED, &lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, kinds[k].ratio, d_sel,
                                                  d_n_sel, d_sink, d_freq, 1, max_keys, d_scratch, sf, d_bar, d_o, 20);
                    const int n = cu_att_block_times(rec, MAXREC);
                    if (us <= 0 || n <= 0) {
                        fprintf(stderr, "times: cu_attention failed\n");
                        return 1;
                    }
                    snprintf(what, sizeof what, "%.3s %s %.1f us", kinds[k].name, fused == 2 ? "mma" : fused ? "fused" : twice ? "dec x2" : "3 kern", us);
                    times_report(what, rec, n);
                }
        }
        free(rec);
        return 0;
    }
    printf("cu_attention, 64 heads x 512, fp8 rows, OFFICIAL, CUDA cores: us a call (k_att_scores or k_att_scores_dec, + k_att_pv + "
           "k_att_combine; default: k_att_dec where it fits), GPU time in a CUDA graph\n");
    printf("%-18s %4s %12s %12s %12s %8s\n", "keys", "T", "k_att_scores", "scores_dec", "default", "speedup");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            if (only && strncasecmp(kinds[k].name, only, 3)) continue;
            const int T = Ts[i];
            const double old = us_per_call(CU_ATT_NO_DEC, &lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, kinds[k].ratio, d_sel, d_n_sel, d_sink,
                                           d_freq, T, max_keys, d_scratch, sf, d_bar, d_o, 200);
            dev_get(o_old, d_o, sizeof(float) * (size_t)T * H * D);
            const double mid = us_per_call(CU_ATT_NO_FUSED, &lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, kinds[k].ratio, d_sel, d_n_sel,
                                           d_sink, d_freq, T, max_keys, d_scratch, sf, d_bar, d_o, 200);
            dev_get(o_mid, d_o, sizeof(float) * (size_t)T * H * D);
            const double neu = us_per_call(0, &lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, kinds[k].ratio, d_sel, d_n_sel, d_sink, d_freq, T,
                                           max_keys, d_scratch, sf, d_bar, d_o, 200);
            dev_get(o_new, d_o, sizeof(float) * (size_t)T * H * D);
            if (old <= 0 || mid <= 0 || neu <= 0) {
                fprintf(stderr, "bench: cu_attention failed\n");
                return 1;
            }
            const int same = !memcmp(o_old, o_new, sizeof(float) * (size_t)T * H * D) && !memcmp(o_old, o_mid, sizeof(float) * (size_t)T * H * D);
            const int dec = cu_attention_decode_launches(1, 0, lay, T, H, D, max_keys, sf);
            const int fus = cu_attention_fused_launches(1, 0, lay, T, H, D, max_keys, sf);
            printf("%-18s %4d %12.1f %12.1f %12.1f %7.2fx %s%s%s\n", kinds[k].name, T, old, mid, neu, old / neu, dec ? "dec" : "",
                   fus ? " fused" : "", same ? "" : "  OUTPUTS DIFFER");
            if (!same) return 1;
        }
    printf("\ntensor cores (CU_ATT_MMA): us a call, k_att_scores_mma + k_att_pv_mma + k_att_combine against k_att_dec_mma where it "
           "fits, and the CUDA cores' default\n");
    printf("%-18s %4s %12s %12s %12s %8s\n", "keys", "T", "3 kernels", "default", "CUDA cores", "speedup");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            if (only && strncasecmp(kinds[k].name, only, 3)) continue;
            const int T = Ts[i];
            const double three = us_per_call(CU_ATT_MMA | CU_ATT_NO_DEC_MMA, &lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, kinds[k].ratio, d_sel,
                                             d_n_sel, d_sink, d_freq, T, max_keys, d_scratch, sf, d_bar, d_o, 200);
            dev_get(o_old, d_o, sizeof(float) * (size_t)T * H * D);
            const double one = us_per_call(CU_ATT_MMA, &lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, kinds[k].ratio, d_sel, d_n_sel, d_sink,
                                           d_freq, T, max_keys, d_scratch, sf, d_bar, d_o, 200);
            dev_get(o_new, d_o, sizeof(float) * (size_t)T * H * D);
            const double cores = us_per_call(0, &lay, d_q, d_kvs, d_pos, d_item_of, d_items, d_sl, kinds[k].ratio, d_sel, d_n_sel, d_sink, d_freq,
                                             T, max_keys, d_scratch, sf, d_bar, d_o, 200);
            if (three <= 0 || one <= 0 || cores <= 0) {
                fprintf(stderr, "bench: cu_attention failed\n");
                return 1;
            }
            const int same = !memcmp(o_old, o_new, sizeof(float) * (size_t)T * H * D);
            const int fus = cu_attention_fused_launches(1, CU_ATT_MMA, lay, T, H, D, max_keys, sf);
            printf("%-18s %4d %12.1f %12.1f %12.1f %7.2fx %s%s\n", kinds[k].name, T, three, one, cores, three / one, fus ? "fused" : "",
                   same ? "" : "  OUTPUTS DIFFER");
            if (!same) return 1;
        }
    return 0;
}
#endif

int main(int argc, char **argv) {
#ifndef ATT_TEST_EMULATE
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu attention: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--bench")) {
        if (argc > 2 && strcasecmp(argv[2], "swa") && strcasecmp(argv[2], "csa") && strcasecmp(argv[2], "hca")) {
            fprintf(stderr, "usage: test_gpu_attention --bench [swa | csa | hca]\n");
            return 2;
        }
        return bench(0, argc > 2 ? argv[2] : NULL);
    }
    if (argc > 1 && !strcmp(argv[1], "--times")) return times_main();
#endif
    if (argc > 1 && strcmp(argv[1], "--bench") && strcmp(argv[1], "--times")) {
        fprintf(stderr, "usage: test_gpu_attention [--bench [swa | csa | hca] | --times]\n");
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hca_20000_rows),
        cmocka_unit_test(hca_fp8_official),
        cmocka_unit_test(csa_top512),
        cmocka_unit_test(window_and_odd_shapes),
        cmocka_unit_test(decode_shapes),
        cmocka_unit_test(decode_kernel_compared),
    };
    return cmocka_run_group_tests_name("gpu attention on long key lists", tests, NULL, NULL);
}
