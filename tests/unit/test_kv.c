/* KV storage formats (issue 5, src/state/kvrows.h).
 *   - row codec: OFFICIAL-simulated rows round-trip exactly through bf16/fp8; kv_dot / kv_axpy give the bits
 *     of dot_f32 / the fp32 accumulation over the decoded row;
 *   - a group of heads' attention over stored rows (sink_attention_heads) = one head's over the decoded rows;
 *   - OFFICIAL mode: fp8 and bf16 KV give logits bit-identical (memcmp) to f32 KV across the parity matrix
 *     (one-shot, token by token, chunks) for flash-like, pro-like and compressed-only topologies;
 *   - EXACT mode: one-shot == decode == chunks within bf16 and within fp8; the deviation from f32 KV is
 *     printed (max relative logit error, argmax agreement). Measured on these random tiny models (900
 *     positions): bf16 98.6 % argmax agreement (99.2 % where f32's top-1 margin >= 2 %), max relative logit
 *     error 0.52; fp8 84.0 % (89.7 %), max relative error 1.02. The 99 % goal is not met by fp8 in EXACT mode:
 *     random tiny weights are chaotic (bf16 alone flips 1.4 % of argmaxes; discrete top-k and MoE routing
 *     flips amplify small changes) and, in EXACT mode, the indexer rows are FP4-stored without the Hadamard
 *     rotation that OFFICIAL mode applies (storing them in bf16 instead lifts fp8 to 91.4 %);
 *   - memory accounting: stored row bytes per layer type equal the formula; Flash-shaped bytes per token;
 *   - save/restore (byte-identical re-save, identical logits after resume, wrong format refused), fork,
 *     batching and rollback in each format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "core/attention.h"
#include "helpers/testmodel.h"
#include "model/formats.h"
#include "model/model.h"
#include "state/kvrows.h"
#include "state/persist.h"
#include "state/sequence.h"

#define SEQ_LEN 300     /* past two HCA rows (256), many CSA rows, far past the window */

typedef struct {
    const char *name, *preset;
    const char *sets[6];
    int n_sets;
} topology;

static const topology topologies[] = {
    {"flash-like", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3},
    {"pro-like", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3},
    {"compressed-only", "flash-tiny", {"compress_ratios=[4,128,4,128]", "num_hidden_layers=4", "sliding_window=16", "index_topk=2"}, 4},
};
/* DSV4_QUICK (the sanitizer run): the first topology only. */
#define N_TOPOS (getenv("DSV4_QUICK") ? 1 : (int)(sizeof topologies / sizeof topologies[0]))

static const int CHUNKS[] = {5, 1, 17, 3, 64, 2, 128, 9, 4};
#define N_CHUNKS (int)(sizeof CHUNKS / sizeof CHUNKS[0])

/* One checkpoint loaded three times, once per KV format. */
typedef struct {
    char dir[256];
    dsv4_model *m[3];
    int vocab;
} models;

static int models_make(models *ms, const topology *tp, dsv4_mode mode) {
    memset(ms, 0, sizeof *ms);
    ms->m[DSV4_KV_F32] = tm_make(tp->preset, tp->sets, tp->n_sets, 1234, mode, ms->dir);
    if (!ms->m[0]) return -1;
    for (int f = DSV4_KV_BF16; f <= DSV4_KV_FP8; f++) {
        dsv4_load_opts lo = { .mode = mode, .quiet = 1, .kv_format = f };
        dsv4_error err;
        if (dsv4_model_load(ms->dir, &lo, &ms->m[f], &err)) {
            fprintf(stderr, "load --kv %s: %s\n", kv_format_name(f), err.msg);
            return -1;
        }
    }
    dsv4_model_info info;
    dsv4_model_get_info(ms->m[0], &info);
    ms->vocab = info.vocab_size;
    return 0;
}

static void models_free(models *ms) {
    for (int f = 0; f < 3; f++) dsv4_model_free(ms->m[f]);
    tm_rmdir(ms->dir);
}

static size_t lbytes(const models *ms, int n) { return sizeof(float) * (size_t)n * (size_t)ms->vocab; }

/* ---- row codec -------------------------------------------------------------------------------------------- */

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static void codec_exact_for_official_rows(void **state) {
    (void)state;
    const int D = 512, R = 64, I = 128;
    uint64_t seed = 7;
    float x[512], y[512], q[512];
    uint8_t buf[4 * 512];
    for (int trial = 0; trial < 200; trial++) {
        const float mag = ldexpf(1.0f, trial % 24 - 12);
        for (int i = 0; i < D; i++) x[i] = frand(&seed) * mag * (i % 97 == 0 ? 50.0f : 1.0f);
        for (int i = 0; i < D; i++) q[i] = frand(&seed);
        /* main row as OFFICIAL mode leaves it: bf16 everywhere, FP8-simulated non-rope dims */
        for (int i = 0; i < D; i++) x[i] = round_bf16(x[i]);
        act_quant_fp8_inplace(x, D - R, 64);
        for (int f = DSV4_KV_BF16; f <= DSV4_KV_FP8; f++) {
            kv_layout l;
            kv_layout_init(&l, f, KV_ROW_MAIN, D, R);
            kv_encode(&l, x, buf);
            kv_decode(&l, buf, y);
            if (memcmp(x, y, sizeof(float) * D)) fail_msg("%s main row not lossless (trial %d)", kv_format_name(f), trial);
            if (kv_dot(&l, q, buf) != dot_f32(q, x, D)) fail_msg("%s kv_dot differs from dot_f32", kv_format_name(f));
            float o1[512], o2[512];
            for (int i = 0; i < D; i++) o1[i] = o2[i] = q[i];
            kv_axpy(&l, 0.37f, buf, o1);
            kv_axpy_f32(0.37f, x, o2, D);
            if (memcmp(o1, o2, sizeof o1)) fail_msg("%s kv_axpy differs", kv_format_name(f));
        }
        /* indexer row: Hadamard, bf16, FP4-simulated in blocks of 32 */
        memcpy(y, x, sizeof(float) * I);
        hadamard_inplace(y, I);
        for (int i = 0; i < I; i++) y[i] = round_bf16(y[i]);
        act_quant_fp4_inplace(y, I, 32);
        kv_layout l;
        kv_layout_init(&l, DSV4_KV_FP8, KV_ROW_INDEX, I, 0);
        assert_int_equal(l.bytes, 64 + 4);
        kv_encode(&l, y, buf);
        float z[128];
        kv_decode(&l, buf, z);
        if (memcmp(y, z, sizeof(float) * I)) fail_msg("fp4 indexer row not lossless (trial %d)", trial);
    }
    /* EXACT-mode rows round: fp8 error within half an E4M3 step of the block scale */
    for (int i = 0; i < D; i++) x[i] = frand(&seed);
    kv_layout l;
    kv_layout_init(&l, DSV4_KV_FP8, KV_ROW_MAIN, D, R);
    assert_int_equal(l.bytes, 448 + 7 + 128);
    kv_encode(&l, x, buf);
    kv_decode(&l, buf, y);
    for (int i = 0; i < D - R; i++) assert_true(fabsf(x[i] - y[i]) <= fabsf(x[i]) / 16.0f + 1e-3f);
    for (int i = D - R; i < D; i++) assert_true(y[i] == round_bf16(x[i]));
}

/* ---- OFFICIAL: every format gives the f32 logits bit for bit ------------------------------------------------- */

static void official_matrix(void **state) {
    (void)state;
    for (int ti = 0; ti < N_TOPOS; ti++) {
        models ms;
        assert_int_equal(models_make(&ms, &topologies[ti], DSV4_MODE_OFFICIAL), 0);
        int32_t tok[SEQ_LEN];
        tm_tokens(tok, SEQ_LEN, ms.vocab, 99);
        float *ref = tm_logits(ms.m[DSV4_KV_F32], tok, SEQ_LEN, NULL, 0);
        assert_non_null(ref);
        for (int f = DSV4_KV_BF16; f <= DSV4_KV_FP8; f++) {
            static const int one[1] = {1};
            float *a = tm_logits(ms.m[f], tok, SEQ_LEN, NULL, 0);
            float *b = tm_logits(ms.m[f], tok, SEQ_LEN, one, 0);   /* one token per call */
            float *c = tm_logits(ms.m[f], tok, SEQ_LEN, CHUNKS, N_CHUNKS);
            assert_true(a && b && c);
            if (memcmp(a, ref, lbytes(&ms, SEQ_LEN))) fail_msg("%s: OFFICIAL %s one-shot differs from f32", topologies[ti].name, kv_format_name(f));
            if (memcmp(b, ref, lbytes(&ms, SEQ_LEN))) fail_msg("%s: OFFICIAL %s decode differs from f32", topologies[ti].name, kv_format_name(f));
            if (memcmp(c, ref, lbytes(&ms, SEQ_LEN))) fail_msg("%s: OFFICIAL %s chunks differ from f32", topologies[ti].name, kv_format_name(f));
            free(a);
            free(b);
            free(c);
        }
        printf("official %-16s bf16 == fp8 == f32 KV logits over %d positions (one-shot, decode, chunks)\n",
               topologies[ti].name, SEQ_LEN);
        free(ref);
        models_free(&ms);
    }
}

/* ---- EXACT: parity within each format, bounded deviation from f32 ------------------------------------------- */

static void exact_parity_and_deviation(void **state) {
    (void)state;
    long agree[3] = {0}, total = 0, decisive = 0, agree_decisive[3] = {0};
    double max_rel[3] = {0}, sum_rel[3] = {0};
    for (int ti = 0; ti < N_TOPOS; ti++) {
        models ms;
        assert_int_equal(models_make(&ms, &topologies[ti], DSV4_MODE_EXACT), 0);
        int32_t tok[SEQ_LEN];
        tm_tokens(tok, SEQ_LEN, ms.vocab, 99);
        float *ref = tm_logits(ms.m[DSV4_KV_F32], tok, SEQ_LEN, NULL, 0);
        assert_non_null(ref);
        for (int f = DSV4_KV_BF16; f <= DSV4_KV_FP8; f++) {
            static const int one[1] = {1};
            float *a = tm_logits(ms.m[f], tok, SEQ_LEN, NULL, 0);
            float *b = tm_logits(ms.m[f], tok, SEQ_LEN, one, 0);
            float *c = tm_logits(ms.m[f], tok, SEQ_LEN, CHUNKS, N_CHUNKS);
            assert_true(a && b && c);
            if (memcmp(a, b, lbytes(&ms, SEQ_LEN))) fail_msg("%s: EXACT %s decode differs from one-shot", topologies[ti].name, kv_format_name(f));
            if (memcmp(a, c, lbytes(&ms, SEQ_LEN))) fail_msg("%s: EXACT %s chunks differ from one-shot", topologies[ti].name, kv_format_name(f));
            for (int p = 0; p < SEQ_LEN; p++) {
                const float *x = a + (size_t)p * ms.vocab, *r = ref + (size_t)p * ms.vocab;
                double err = 0, mag = 0;
                int ax = 0, ar = 0;
                for (int j = 0; j < ms.vocab; j++) {
                    err = fmax(err, fabs((double)x[j] - r[j]));
                    mag = fmax(mag, fabs((double)r[j]));
                    if (x[j] > x[ax]) ax = j;
                    if (r[j] > r[ar]) ar = j;
                }
                const double rel = err / (mag > 0 ? mag : 1);
                max_rel[f] = fmax(max_rel[f], rel);
                sum_rel[f] += rel;
                agree[f] += ax == ar;
                /* positions where f32's top-1 leads the runner-up by >= 2% of the largest |logit| */
                double second = -INFINITY;
                for (int j = 0; j < ms.vocab; j++)
                    if (j != ar) second = fmax(second, r[j]);
                if (r[ar] - second >= 0.02 * mag) {
                    decisive += f == DSV4_KV_BF16;
                    agree_decisive[f] += ax == ar;
                }
            }
            free(a);
            free(b);
            free(c);
        }
        total += SEQ_LEN;
        free(ref);
        models_free(&ms);
    }
    for (int f = DSV4_KV_BF16; f <= DSV4_KV_FP8; f++) {
        const double rate = (double)agree[f] / (double)total;
        printf("exact %-4s KV vs f32 KV over %ld positions (%d topologies): max relative logit error %.3e, "
               "mean %.3e, argmax agreement %.2f%% (%.2f%% of the %ld positions with a top-1 margin >= 2%%)\n",
               kv_format_name(f), total, N_TOPOS, max_rel[f], sum_rel[f] / (double)total, 100.0 * rate,
               100.0 * (double)agree_decisive[f] / (double)(decisive ? decisive : 1), decisive);
    }
    for (int f = DSV4_KV_BF16; f <= DSV4_KV_FP8; f++) {
        /* measured: bf16 98.6 %, fp8 84 % over the three random tiny models (97.7 % and 79 % on the first
         * alone, the DSV4_QUICK run): regression guards a little below what was measured */
        assert_true((double)agree[f] / (double)total >= (f == DSV4_KV_BF16 ? 0.95 : 0.75));
        assert_true(max_rel[f] < 1.5);
    }
}

/* ---- memory accounting ---------------------------------------------------------------------------------------- */

static void memory_accounting(void **state) {
    (void)state;
    /* the formula by hand, Flash-shaped: 43 layers, 0/1 window-only, then CSA (4) on even and HCA (128) on odd;
     * head_dim 512 with 64 rope dims, indexer 128 */
    int ratio[43];
    int n4 = 0, n128 = 0;
    for (int L = 0; L < 43; L++) {
        ratio[L] = L < 2 ? 0 : L % 2 == 0 ? 4 : 128;
        n4 += ratio[L] == 4;
        n128 += ratio[L] == 128;
    }
    static const double main_row[3] = {512 * 4, 512 * 2, 448 + 448 / 64 + 64 * 2};
    static const double index_row[3] = {128 * 4, 128 * 2, 128 / 2 + 128 / 32};
    for (int f = 0; f < 3; f++) {
        kv_cost k;
        kv_cost_of(f, 43, ratio, 512, 64, 128, 128, &k);
        assert_int_equal(k.main_row, (size_t)main_row[f]);
        assert_int_equal(k.index_row, (size_t)index_row[f]);
        assert_true(k.per_token_csa == (main_row[f] + index_row[f]) / 4);
        assert_true(k.per_token_hca == main_row[f] / 128);
        assert_true(k.per_token == n4 * k.per_token_csa + n128 * k.per_token_hca);
        printf("flash-shaped KV %-4s: %.1f bytes per context token (CSA layer %.2f, HCA layer %.3f; rows %zu + %zu "
               "bytes), window rings %.2f MiB\n", kv_format_name(f), k.per_token, k.per_token_csa, k.per_token_hca,
               k.main_row, k.index_row, k.ring_bytes / 1048576.0);
        if (f == DSV4_KV_F32) assert_true(k.per_token == 13760.0);
        if (f == DSV4_KV_FP8) assert_true(k.per_token < 4096.0);
    }
    /* a live sequence stores exactly that many bytes per layer type */
    models ms;
    assert_int_equal(models_make(&ms, &topologies[0], DSV4_MODE_EXACT), 0);
    int32_t tok[SEQ_LEN];
    tm_tokens(tok, SEQ_LEN, ms.vocab, 5);
    for (int f = 0; f < 3; f++) {
        dsv4_model *m = ms.m[f];
        const dsv4_config *c = &m->cfg;
        dsv4_seq *s;
        dsv4_error err;
        assert_int_equal(dsv4_seq_new(m, &s, &err), 0);
        dsv4_step_item it = { .seq = s, .tokens = tok, .n_tokens = SEQ_LEN, .want = DSV4_LOGITS_NONE, .logits = NULL };
        assert_int_equal(dsv4_step(m, &it, 1, &err), 0);
        const size_t mb = kv_row_bytes(f, KV_ROW_MAIN, c->head_dim, c->rope_dim);
        const size_t ib = kv_row_bytes(f, KV_ROW_INDEX, c->index_head_dim, 0);
        for (int L = 0; L < c->n_layers; L++) {
            const dsv4_layer_state *ls = &s->layer[L];
            const int r = c->compress_ratio[L];
            assert_int_equal(s->kv_main.bytes, mb);
            assert_int_equal(ls->crows.lay.bytes, mb);
            assert_int_equal(ls->irows.lay.bytes, ib);
            assert_int_equal(ls->crows.n, r ? SEQ_LEN / r : 0);
            assert_int_equal(ls->irows.n, r == 4 ? SEQ_LEN / 4 : 0);
        }
        /* the state file grows by exactly the formula's rows between two positions (and 4 bytes per token id) */
        size_t len;
        void *buf;
        assert_int_equal(dsv4_seq_save_mem(s, &buf, &len, &err), 0);
        persist_header h;
        assert_int_equal(persist_read_header(buf, len, &h, &err), 0);
        persist_sizes a, b;
        h.pos = 4096;
        assert_int_equal(persist_sizes_of(&h, &a), 0);
        h.pos = 4096 + 512;
        assert_int_equal(persist_sizes_of(&h, &b), 0);
        kv_cost k;
        kv_cost_of(f, c->n_layers, c->compress_ratio, c->head_dim, c->rope_dim, c->index_head_dim, c->window, &k);
        assert_true((double)(b.total - a.total) == 512.0 * (k.per_token + 4));
        free(buf);
        dsv4_seq_free(s);
    }
    models_free(&ms);
}

/* ---- save / restore / fork / batching / rollback ----------------------------------------------------------------- */

static float *continue_logits(dsv4_model *m, dsv4_seq *s, const int32_t *tok, int n) {
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)info.vocab_size);
    dsv4_error err;
    for (int i = 0; i < n; i++) {
        dsv4_step_item it = { .seq = s, .tokens = tok + i, .n_tokens = 1, .want = DSV4_LOGITS_ALL, .logits = out + (size_t)i * info.vocab_size };
        if (dsv4_step(m, &it, 1, &err)) fail_msg("step: %s", err.msg);
    }
    return out;
}

static void state_round_trips(void **state) {
    (void)state;
    const int CUT = 150, REST = 40;
    for (int mode = 0; mode < 2; mode++) {
        models ms;
        assert_int_equal(models_make(&ms, &topologies[0], mode ? DSV4_MODE_OFFICIAL : DSV4_MODE_EXACT), 0);
        int32_t tok[SEQ_LEN];
        tm_tokens(tok, SEQ_LEN, ms.vocab, 11);
        for (int f = 0; f < 3; f++) {
            dsv4_model *m = ms.m[f];
            dsv4_error err;
            float *ref = tm_logits(m, tok, CUT + REST, NULL, 0);
            dsv4_seq *s, *r, *k;
            assert_int_equal(dsv4_seq_new(m, &s, &err), 0);
            dsv4_step_item it = { .seq = s, .tokens = tok, .n_tokens = CUT, .want = DSV4_LOGITS_NONE, .logits = NULL };
            assert_int_equal(dsv4_step(m, &it, 1, &err), 0);
            void *b1, *b2;
            size_t l1, l2;
            assert_int_equal(dsv4_seq_save_mem(s, &b1, &l1, &err), 0);
            assert_int_equal(l1, dsv4_seq_state_bytes(s));
            assert_int_equal(dsv4_seq_load_mem(m, b1, l1, &r, &err), 0);
            assert_int_equal(dsv4_seq_save_mem(r, &b2, &l2, &err), 0);
            assert_int_equal(l1, l2);
            if (memcmp(b1, b2, l1)) fail_msg("%s: re-save of a restored state differs", kv_format_name(f));
            /* another KV format cannot take this state */
            for (int g = 0; g < 3; g++) {
                if (g == f) continue;
                dsv4_seq *x = NULL;
                assert_int_equal(dsv4_seq_load_mem(ms.m[g], b1, l1, &x, &err), DSV4_E_STATE);
                assert_non_null(strstr(err.msg, "KV cache as"));
                assert_null(x);
            }
            assert_int_equal(dsv4_seq_fork(s, &k, &err), 0);
            /* resume the restored, the forked and the original sequence: all give the uninterrupted logits */
            float *lr = continue_logits(m, r, tok + CUT, REST);
            float *lk = continue_logits(m, k, tok + CUT, REST);
            /* the original one goes through a batch step with the fork of a shorter prefix and a rollback */
            dsv4_seq_snapshot *snap;
            assert_int_equal(dsv4_seq_snapshot_new(s, &snap, &err), 0);
            float junk[4 * 4096];
            assert_true((size_t)ms.vocab * 4 <= sizeof junk / sizeof junk[0]);
            int32_t wrong[4] = {tok[CUT], (tok[CUT + 1] + 1) % ms.vocab, 3, 4};
            dsv4_step_item sp = { .seq = s, .tokens = wrong, .n_tokens = 4, .want = DSV4_LOGITS_ALL, .logits = junk };
            assert_int_equal(dsv4_step(m, &sp, 1, &err), 0);
            assert_int_equal(dsv4_seq_rollback(s, snap, 1, &err), 0);   /* keep tok[CUT] */
            dsv4_seq_snapshot_free(snap);
            dsv4_seq *other;
            assert_int_equal(dsv4_seq_new(m, &other, &err), 0);
            float *lo = malloc(lbytes(&ms, 50)), *ls_ = malloc(lbytes(&ms, REST - 1));
            dsv4_step_item batch[2] = {
                { .seq = s, .tokens = tok + CUT + 1, .n_tokens = REST - 1, .want = DSV4_LOGITS_ALL, .logits = ls_ },
                { .seq = other, .tokens = tok, .n_tokens = 50, .want = DSV4_LOGITS_ALL, .logits = lo },
            };
            assert_int_equal(dsv4_step(m, batch, 2, &err), 0);
            const size_t row = lbytes(&ms, 1);
            if (memcmp(lr, ref + (size_t)CUT * ms.vocab, lbytes(&ms, REST))) fail_msg("%s: logits after restore differ", kv_format_name(f));
            if (memcmp(lk, ref + (size_t)CUT * ms.vocab, lbytes(&ms, REST))) fail_msg("%s: logits after fork differ", kv_format_name(f));
            if (memcmp(ls_, ref + (size_t)(CUT + 1) * ms.vocab, lbytes(&ms, REST - 1)))
                fail_msg("%s: logits after rollback + batched step differ", kv_format_name(f));
            if (memcmp(lo, ref, 50 * row)) fail_msg("%s: batched prefill differs", kv_format_name(f));
            printf("%s %-4s: state %zu bytes at %d tokens; save/restore/fork/rollback/batch ok\n",
                   mode ? "official" : "exact", kv_format_name(f), l1, CUT);
            free(lo);
            free(ls_);
            free(lr);
            free(lk);
            free(ref);
            free(b1);
            free(b2);
            dsv4_seq_free(other);
            dsv4_seq_free(s);
            dsv4_seq_free(r);
            dsv4_seq_free(k);
        }
        models_free(&ms);
    }
}

/* ---- a group of heads' attention ------------------------------------------------------------------------ */

/* sink_attention_heads (a task's group of heads, each stored row read and decoded once for the group) =
 * sink_attention (one head over f32 keys) over the decoded rows, by memcmp: every format, both modes, groups of
 * 1-4 heads, widths with a partial 64-column block and an fp8 part that is not a multiple of 32, 1 to 130 keys. */
static void heads_equal_one_head(void **state) {
    (void)state;
    enum { MAXK = 130, MAXD = 512 };
    static const int widths[][2] = { {512, 64}, {80, 16}, {200, 64} };
    static const int nks[] = { 1, 7, 33, MAXK };
    static uint8_t rows[MAXK][4 * MAXD];
    static float dec[MAXK][MAXD], q[4][MAXD], out[4][MAXD], ref[MAXD], P[4 * MAXK], sc[MAXK];
    uint64_t seed = 11;
    int checked = 0;
    for (int w = 0; w < 3; w++) {
        const int D = widths[w][0], R = widths[w][1];
        const float scale = 1.0f / sqrtf((float)D);
        for (int f = DSV4_KV_F32; f <= DSV4_KV_FP8; f++) {
            kv_layout l;
            kv_layout_init(&l, f, KV_ROW_MAIN, D, R);
            for (int a = 0; a < 4; a++) {
                const int nk = nks[a];
                const uint8_t *keys[MAXK];
                const float *fkeys[MAXK];
                for (int i = 0; i < nk; i++) {
                    float x[MAXD];
                    for (int j = 0; j < D; j++) x[j] = frand(&seed) * (j % 31 == 0 ? 8.0f : 1.0f);
                    kv_encode(&l, x, rows[i]);
                    kv_decode(&l, rows[i], dec[i]);
                    keys[i] = rows[i];
                    fkeys[i] = dec[i];
                }
                for (int G = 1; G <= ATT_GROUP; G++)
                    for (int mode = DSV4_MODE_EXACT; mode <= DSV4_MODE_OFFICIAL; mode++) {
                        const float *qp[ATT_GROUP];
                        float *op[ATT_GROUP], sink[ATT_GROUP];
                        for (int g = 0; g < G; g++) {
                            for (int j = 0; j < D; j++) q[g][j] = 3.0f * frand(&seed);
                            sink[g] = frand(&seed);
                            qp[g] = q[g];
                            op[g] = out[g];
                        }
                        sink_attention_heads((dsv4_mode)mode, &l, qp, G, keys, nk, scale, sink, P, op);
                        for (int g = 0; g < G; g++) {
                            sink_attention((dsv4_mode)mode, q[g], fkeys, nk, D, scale, sink[g], sc, ref);
                            if (memcmp(ref, out[g], sizeof(float) * (size_t)D))
                                fail_msg("%s D=%d nk=%d G=%d mode %d: head %d differs from one-head attention",
                                         kv_format_name(f), D, nk, G, mode, g);
                            checked++;
                        }
                    }
            }
        }
    }
    assert_int_equal(checked, 3 * 3 * 4 * 10 * 2);
}

static void refuses_unknown_format(void **state) {
    (void)state;
    dsv4_error err;
    assert_int_equal(kv_format_check(3, 512, 64, 128, &err), DSV4_E_ARG);
    assert_int_equal(kv_format_check(-1, 512, 64, 128, &err), DSV4_E_ARG);
    assert_int_equal(kv_format_parse("fp8"), DSV4_KV_FP8);
    assert_int_equal(kv_format_parse("fp4"), -1);
    int f, r;
    assert_int_equal(persist_kv_unpack(persist_kv_pack(DSV4_KV_FP8, 64), &f, &r), 0);
    assert_int_equal(f, DSV4_KV_FP8);
    assert_int_equal(r, 64);
    assert_int_equal(persist_kv_unpack(1u | 64u << 8, &f, &r), -1);   /* bf16 has no rope split */
    assert_int_equal(persist_kv_unpack(7u, &f, &r), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(codec_exact_for_official_rows),
        cmocka_unit_test(heads_equal_one_head),
        cmocka_unit_test(refuses_unknown_format),
        cmocka_unit_test(memory_accounting),
        cmocka_unit_test(official_matrix),
        cmocka_unit_test(exact_parity_and_deviation),
        cmocka_unit_test(state_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
