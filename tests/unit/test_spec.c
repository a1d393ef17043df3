/* Speculative decoding (issue 6, spec §14.7, §15.4) is lossless, EXACT mode, memcmp:
 *   - greedy: the tokens equal plain greedy decoding for every drafter (ngram, self, caller-supplied drafts),
 *     single stream and several streams verified in one ragged step, over > 128 generated positions with a
 *     window of 8 (compressor emissions of ratio 4 and 128, many window wraps, drafts longer than the window);
 *   - after every verification step the serialised state (dsv4_seq_save_mem) is byte-identical to that of plain
 *     one-token-at-a-time decoding of the same committed tokens;
 *   - self-draft reaches 100 % acceptance (greedy and sampling); caller-supplied drafts with a planted error are accepted exactly up
 *     to the error;
 *   - sampling: on an 8-token vocabulary the joint distribution of the next two tokens and the marginal of the
 *     third, drawn with speculation from drafters whose distribution differs from the target's (a fixed
 *     distribution q; a deterministic drafter), fit the exact target distribution (enumerated with forks):
 *     Pearson chi-square, the test fails at p < 0.001 (critical value by Wilson-Hilferty). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "helpers/testmodel.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "model/model.h" /* hc_mult: the width of the exported hidden rows */

#define N_PROMPT 24
#define N_GEN 150     /* positions 23 .. 173: past the first ratio-128 emission, ~20 window wraps of 8 */
#define MAX_STREAMS 3

static const char *const FLASH_SETS[] = {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"};

/* A plain greedy reference run: its output and the serialised state at every position it passed. */
typedef struct {
    int32_t prompt[N_PROMPT];
    int32_t out[N_GEN];
    void *state[N_PROMPT + N_GEN];   /* state[p]: after processing p tokens (p >= N_PROMPT - 1) */
    size_t len[N_PROMPT + N_GEN];
} reference;

typedef struct {
    dsv4_model *m;
    char dir[256];
    int vocab;
    reference ref[MAX_STREAMS];
} fixture;

static void *save_or_fail(const dsv4_seq *s, size_t *len) {
    void *buf;
    dsv4_error err;
    if (dsv4_seq_save_mem(s, &buf, len, &err)) fail_msg("save: %s", err.msg);
    return buf;
}

/* Prompts with repeats so that prompt lookup finds something; the rest of the output is the model's. */
static void make_prompt(int32_t *p, int vocab, uint64_t seed) {
    tm_tokens(p, N_PROMPT / 2, vocab, seed);
    memcpy(p + N_PROMPT / 2, p, sizeof(int32_t) * (N_PROMPT / 2));
    p[N_PROMPT - 3] = (p[N_PROMPT - 3] + 1) % vocab;
}

/* Plain decoding as the CLI does it, one token per step, the prompt but its last token in one call. */
static int build_reference(dsv4_model *m, reference *r) {
    dsv4_seq *s;
    dsv4_error err;
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    float *logits = malloc(sizeof(float) * (size_t)info.vocab_size);
    if (!logits || dsv4_seq_new(m, &s, &err)) return -1;
    dsv4_sampling sp = {0};
    sp.top_p = 1.0f;
    dsv4_sampler smp;
    if (dsv4_sampler_init(&smp, &sp, info.vocab_size, &err)) return -1;
    dsv4_step_item it = { s, r->prompt, N_PROMPT - 1, DSV4_LOGITS_NONE, NULL };
    if (dsv4_step(m, &it, 1, &err)) return -1;
    int32_t next = r->prompt[N_PROMPT - 1];
    for (int g = 0; g < N_GEN; g++) {
        const int64_t p = dsv4_seq_position(s);
        if (dsv4_seq_save_mem(s, &r->state[p], &r->len[p], &err)) return -1;
        dsv4_step_item d = { s, &next, 1, DSV4_LOGITS_LAST, logits };
        if (dsv4_step(m, &d, 1, &err)) return -1;
        next = r->out[g] = dsv4_sample(&smp, logits);
    }
    const int64_t p = dsv4_seq_position(s);
    if (dsv4_seq_save_mem(s, &r->state[p], &r->len[p], &err)) return -1;
    dsv4_sampler_free(&smp);
    dsv4_seq_free(s);
    free(logits);
    return 0;
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->m = tm_make("flash-tiny", FLASH_SETS, 3, 4321, DSV4_MODE_EXACT, f->dir);
    if (!f->m) return -1;
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    for (int i = 0; i < MAX_STREAMS; i++) {
        make_prompt(f->ref[i].prompt, f->vocab, 77 + (uint64_t)i);
        if (build_reference(f->m, &f->ref[i])) return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    for (int i = 0; i < MAX_STREAMS; i++)
        for (int p = 0; p < N_PROMPT + N_GEN; p++) free(f->ref[i].state[p]);
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

/* ---- greedy: tokens and states equal plain decoding ------------------------------------------------------ */

typedef enum { D_NGRAM, D_SELF, D_EXTERNAL } drafter_kind;
static const char *const KIND_NAME[] = {"ngram", "self", "external"};

static void make_drafter(fixture *f, drafter_kind kind, const dsv4_sampling *sp, dsv4_drafter *d) {
    dsv4_error err;
    int rc = kind == D_NGRAM ? dsv4_drafter_ngram(1, 4, d, &err)
           : kind == D_SELF  ? dsv4_drafter_self(f->m, sp, d, &err)
                             : dsv4_drafter_external(f->vocab, d, &err);
    if (rc) fail_msg("drafter: %s", err.msg);
}

/* Caller-supplied drafts: the reference continuation with a planted error at a step-dependent place (or
 * none), so the expected number of accepted drafts is known exactly. Returns that number. */
static int plant_external(dsv4_spec_stream *s, const reference *r, int draft, int step) {
    int n_out;
    dsv4_spec_stream_output(s, &n_out);
    int k = draft < N_GEN - n_out - 1 ? draft : N_GEN - n_out - 1;
    if (k < 0) k = 0;
    int32_t d[32];
    memcpy(d, r->out + n_out, sizeof(int32_t) * (size_t)k);
    const int wrong = step % (draft + 2); /* draft + 1 and above: no error */
    if (wrong < k) d[wrong] = (d[wrong] + 1) % 512;
    dsv4_error err;
    if (dsv4_drafter_external_set(dsv4_spec_stream_drafter(s), d, k, NULL, &err)) fail_msg("set: %s", err.msg);
    return wrong < k ? wrong : k;
}

typedef struct {
    dsv4_spec_stream *s;
    const reference *r;
    drafter_kind kind;
    int expect_acc;
} run_item;

/* Check one stream after a step: output prefix equals the reference, state equals the reference state. */
static void check_stream(const run_item *ri, int step) {
    int n_out;
    const int32_t *out = dsv4_spec_stream_output(ri->s, &n_out);
    for (int i = 0; i < n_out; i++)
        if (out[i] != ri->r->out[i])
            fail_msg("%s step %d: token %d is %d, plain greedy gave %d", KIND_NAME[ri->kind], step, i, out[i], ri->r->out[i]);
    const dsv4_seq *q = dsv4_spec_stream_seq(ri->s);
    const int64_t p = dsv4_seq_position(q);
    assert_int_equal(p, N_PROMPT - 1 + n_out);
    assert_int_equal(dsv4_spec_stream_pending(ri->s), n_out ? out[n_out - 1] : ri->r->prompt[N_PROMPT - 1]);
    size_t len;
    void *buf = save_or_fail(q, &len);
    if (len != ri->r->len[p] || memcmp(buf, ri->r->state[p], len))
        fail_msg("%s step %d: serialised state at position %lld differs from plain decoding", KIND_NAME[ri->kind], step,
                 (long long)p);
    free(buf);
}

/* Run n streams together to the end, checking after every step. Returns the total stats per stream. */
static void run_greedy(fixture *f, const drafter_kind *kinds, int n, int draft, dsv4_spec_stats *st) {
    dsv4_error err;
    run_item it[MAX_STREAMS];
    dsv4_spec_stream *ss[MAX_STREAMS];
    dsv4_sampling sp = {0};
    sp.top_p = 1.0f;
    dsv4_spec_opts o = { .draft = draft, .max_new_tokens = N_GEN, .stop_on_eos = 0 };
    for (int i = 0; i < n; i++) {
        dsv4_drafter d;
        make_drafter(f, kinds[i], &sp, &d);
        it[i] = (run_item){ NULL, &f->ref[i], kinds[i], -1 };
        if (dsv4_spec_stream_new(f->m, f->ref[i].prompt, N_PROMPT, &sp, &o, &d, &it[i].s, &err))
            fail_msg("stream: %s", err.msg);
        ss[i] = it[i].s;
    }
    for (int step = 0;; step++) {
        int live = 0;
        for (int i = 0; i < n; i++) {
            if (dsv4_spec_stream_done(ss[i])) continue;
            live++;
            if (kinds[i] == D_EXTERNAL) it[i].expect_acc = plant_external(ss[i], it[i].r, draft, step);
        }
        if (!live) break;
        dsv4_spec_stats before[MAX_STREAMS];
        for (int i = 0; i < n; i++) dsv4_spec_stream_stats(ss[i], &before[i]);
        if (dsv4_spec_step(f->m, ss, n, &err)) fail_msg("spec step %d: %s", step, err.msg);
        for (int i = 0; i < n; i++) {
            check_stream(&it[i], step);
            dsv4_spec_stats now;
            dsv4_spec_stream_stats(ss[i], &now);
            if (kinds[i] == D_EXTERNAL && now.steps > before[i].steps)
                assert_int_equal(now.accepted - before[i].accepted, it[i].expect_acc);
        }
    }
    for (int i = 0; i < n; i++) {
        int n_out;
        dsv4_spec_stream_output(ss[i], &n_out);
        assert_int_equal(n_out, N_GEN);
        dsv4_spec_stream_stats(ss[i], &st[i]);
        assert_int_equal(st[i].emitted, N_GEN);
        if (kinds[i] == D_SELF) assert_int_equal(st[i].accepted, st[i].proposed); /* 100 % */
        print_message("  %-8s draft %2d: %lld steps, %lld proposed, %lld accepted (%.1f %%), %.2f tokens/step\n",
                      KIND_NAME[kinds[i]], draft, (long long)st[i].steps, (long long)st[i].proposed,
                      (long long)st[i].accepted, st[i].proposed ? 100.0 * st[i].accepted / st[i].proposed : 0.0,
                      (double)st[i].emitted / (double)st[i].steps);
        dsv4_spec_stream_free(ss[i]);
    }
}

static void greedy_ngram(void **state) {
    dsv4_spec_stats st;
    const drafter_kind k = D_NGRAM;
    run_greedy(*state, &k, 1, 4, &st);
}

static void greedy_self(void **state) {
    dsv4_spec_stats st;
    const drafter_kind k = D_SELF;
    run_greedy(*state, &k, 1, 5, &st);
    assert_true(st.steps <= N_GEN / 6 + 1);
}

/* Drafts of 12 tokens with a window of 8: a rejection undoes ring writes that wrapped past the window. */
static void greedy_external_long_drafts(void **state) {
    dsv4_spec_stats st;
    const drafter_kind k = D_EXTERNAL;
    run_greedy(*state, &k, 1, 12, &st);
}

static void greedy_batched(void **state) {
    dsv4_spec_stats st[3];
    const drafter_kind k[3] = {D_NGRAM, D_SELF, D_EXTERNAL};
    run_greedy(*state, k, 3, 6, st);
}

/* ---- the extension point for MTP / DSpark: committed rows' target features reach on_commit ---------------- */

typedef struct {
    int dim;
    float *rows;         /* [N_PROMPT + N_GEN][dim]: recorded hidden row per position */
    int32_t *next;       /* [N_PROMPT + N_GEN]: the committed token after each position */
    char *seen;
    dsv4_drafter inner;  /* drafts come from a self drafter, so steps commit several rows */
} rec_ctx;

static int rec_propose(void *ctx, const int32_t *history, int64_t n_hist, int32_t last, int max_k, int32_t *draft,
                       float *draft_probs, int *probs_given, float *confidence, int *conf_given, dsv4_error *err) {
    rec_ctx *c = ctx;
    return c->inner.propose(c->inner.ctx, history, n_hist, last, max_k, draft, draft_probs, probs_given, confidence,
                            conf_given, err);
}

static int rec_commit(void *ctx, const int32_t *committed, int n_committed, const dsv4_spec_verify_info *vi,
                      dsv4_error *err) {
    rec_ctx *c = ctx;
    assert_non_null(vi->hidden);
    assert_int_equal(vi->hidden_dim, c->dim);
    assert_int_equal(vi->n_processed, n_committed);
    for (int r = 0; r < vi->n_processed; r++) {
        const int64_t p = vi->pos0 + r;
        assert_true(p >= 0 && p < N_PROMPT + N_GEN);
        assert_false(c->seen[p]);  /* each committed position exactly once, rejected ones never */
        c->seen[p] = 1;
        memcpy(c->rows + p * c->dim, vi->hidden + (size_t)r * c->dim, sizeof(float) * (size_t)c->dim);
        c->next[p] = committed[r];
    }
    return c->inner.on_commit ? c->inner.on_commit(c->inner.ctx, committed, n_committed, vi, err) : 0;
}

static void rec_free(void *ctx) {
    rec_ctx *c = ctx;
    dsv4_drafter_free(&c->inner);
    free(c->rows);
    free(c->next);
    free(c->seen);
    free(c);
}

static void hidden_rows_reach_drafter(void **state) {
    fixture *f = *state;
    dsv4_error err;
    const reference *r = &f->ref[1];
    const int dim = f->m->cfg.hc_mult * f->m->cfg.dim, T = N_PROMPT + N_GEN;
    dsv4_sampling sp = {0};
    sp.top_p = 1.0f;
    rec_ctx *c = calloc(1, sizeof *c);
    c->dim = dim;
    c->rows = malloc(sizeof(float) * (size_t)T * (size_t)dim);
    c->next = malloc(sizeof(int32_t) * (size_t)T);
    c->seen = calloc((size_t)T, 1);
    if (dsv4_drafter_self(f->m, &sp, &c->inner, &err)) fail_msg("%s", err.msg);
    dsv4_drafter d = { "recorder", c, rec_propose, rec_commit, rec_free, dim };
    dsv4_spec_opts o = { .draft = 7, .max_new_tokens = N_GEN };
    dsv4_spec_stream *s;
    if (dsv4_spec_stream_new(f->m, r->prompt, N_PROMPT, &sp, &o, &d, &s, &err)) fail_msg("%s", err.msg);
    while (!dsv4_spec_stream_done(s))
        if (dsv4_spec_step(f->m, &s, 1, &err)) fail_msg("%s", err.msg);
    /* the reference: one step over prompt + output (but the last token, still pending), hidden rows of all */
    int32_t all[N_PROMPT + N_GEN];
    memcpy(all, r->prompt, sizeof r->prompt);
    memcpy(all + N_PROMPT, r->out, sizeof r->out);
    const int n = T - 1;
    float *ref = malloc(sizeof(float) * (size_t)n * (size_t)dim);
    dsv4_seq *q;
    if (dsv4_seq_new(f->m, &q, &err)) fail_msg("%s", err.msg);
    dsv4_step_item it = { q, all, n, DSV4_LOGITS_NONE, NULL, ref };
    if (dsv4_step(f->m, &it, 1, &err)) fail_msg("%s", err.msg);
    for (int p = 0; p < n; p++) {
        if (!c->seen[p]) fail_msg("position %d never reached the drafter", p);
        assert_int_equal(c->next[p], all[p + 1]);
        if (memcmp(c->rows + (size_t)p * dim, ref + (size_t)p * dim, sizeof(float) * (size_t)dim))
            fail_msg("hidden row of position %d differs from a one-shot forward", p);
    }
    assert_false(c->seen[n]); /* the pending token was never processed */
    dsv4_seq_free(q);
    free(ref);
    dsv4_spec_stream_free(s);
}

/* ---- errors ------------------------------------------------------------------------------------------------ */

static void refusals(void **state) {
    fixture *f = *state;
    dsv4_error err;
    dsv4_sampling sp = {0};
    sp.top_p = 1.0f;
    dsv4_spec_opts o = { .draft = 16, .max_new_tokens = 4 }; /* max_spec 16: at most 15 drafts */
    dsv4_drafter d;
    dsv4_spec_stream *s = NULL;
    if (dsv4_drafter_ngram(1, 3, &d, &err)) fail_msg("%s", err.msg);
    assert_int_equal(dsv4_spec_stream_new(f->m, f->ref[0].prompt, N_PROMPT, &sp, &o, &d, &s, &err), DSV4_E_ARG);
    assert_null(s);
    assert_non_null(strstr(err.msg, "draft length"));
    assert_null(d.ctx); /* ownership taken, freed */
    assert_int_equal(dsv4_drafter_ngram(3, 1, &d, &err), DSV4_E_ARG);
    /* external drafts outside the vocabulary */
    o.draft = 4;
    if (dsv4_drafter_external(f->vocab, &d, &err)) fail_msg("%s", err.msg);
    if (dsv4_spec_stream_new(f->m, f->ref[0].prompt, N_PROMPT, &sp, &o, &d, &s, &err)) fail_msg("%s", err.msg);
    const int32_t bad[2] = {1, 100000};
    assert_int_equal(dsv4_drafter_external_set(dsv4_spec_stream_drafter(s), bad, 2, NULL, &err), DSV4_E_ARG);
    const int32_t rep[2] = {1, 2};
    assert_int_equal(dsv4_spec_step(f->m, (dsv4_spec_stream *[]){s, s}, 2, &err), DSV4_E_ARG);
    if (dsv4_drafter_external_set(dsv4_spec_stream_drafter(s), rep, 2, NULL, &err)) fail_msg("%s", err.msg);
    if (dsv4_spec_step(f->m, &s, 1, &err)) fail_msg("%s", err.msg);
    dsv4_spec_stream_free(s);
}

/* ---- sampling is lossless: chi-square against the exact distribution -------------------------------------- */

#define SV 8            /* vocabulary of the sampling model */
#define N_SAMPLES_FULL 4000
#define N_SAMPLES_QUICK 600  /* DSV4_QUICK (sanitizer builds): same test, less power */
static int n_samples(void) { return getenv("DSV4_QUICK") ? N_SAMPLES_QUICK : N_SAMPLES_FULL; }

/* A drafter that draws i.i.d. from a fixed distribution q (unlike the target's), and says so. */
typedef struct {
    float q[SV];
    uint64_t x;
    int deterministic;  /* 1: always proposes tokens 3, 5, 3, 5, ... with no distribution (one-hot p_d) */
} q_ctx;

static double q_uniform(uint64_t *x) {
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*x >> 11) * (1.0 / 9007199254740992.0);
}

static int q_propose(void *ctx, const int32_t *history, int64_t n_hist, int32_t last, int max_k, int32_t *draft,
                     float *draft_probs, int *probs_given, float *confidence, int *conf_given, dsv4_error *err) {
    q_ctx *c = ctx;
    for (int j = 0; j < max_k; j++) {
        if (c->deterministic) { draft[j] = j % 2 ? 5 : 3; continue; }
        double u = q_uniform(&c->x), acc = 0;
        draft[j] = SV - 1;
        for (int i = 0; i < SV; i++) { acc += c->q[i]; if (u < acc) { draft[j] = i; break; } }
        if (draft_probs) memcpy(draft_probs + (size_t)j * SV, c->q, sizeof c->q);
    }
    *probs_given = draft_probs && !c->deterministic;
    return max_k;
}

/* Critical value of chi-square with df degrees of freedom at upper tail 0.001 (Wilson-Hilferty, z = 3.0902). */
static double chi2_crit_001(int df) {
    const double a = 2.0 / (9.0 * df), z = 3.0902;
    const double c = 1.0 - a + z * sqrt(a);
    return df * c * c * c;
}

/* Pearson chi-square of counts against probabilities, cells with expected < 5 pooled into one. */
static void chi_square(const char *what, const long *count, const double *prob, int n_cells, long total) {
    double chi = 0, pool_e = 0, pool_o = 0;
    int df = -1;
    for (int i = 0; i < n_cells; i++) {
        const double e = prob[i] * (double)total;
        if (e < 5.0) { pool_e += e; pool_o += (double)count[i]; continue; }
        chi += (count[i] - e) * (count[i] - e) / e;
        df++;
    }
    if (pool_e > 0) {
        if (pool_e >= 1.0) { chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e; df++; }
        else if (pool_o > 5) fail_msg("%s: %g samples in cells of expected %g", what, pool_o, pool_e);
    }
    const double crit = chi2_crit_001(df > 0 ? df : 1);
    print_message("  %-28s chi2 = %7.2f, df = %2d, critical (p = 0.001) = %6.2f\n", what, chi, df, crit);
    if (chi > crit) fail_msg("%s: chi-square %.2f > %.2f (df %d): the distribution differs from plain sampling", what, chi, crit, df);
}

typedef struct {
    dsv4_model *m;
    char dir[256];
    int32_t prompt[6];
    double p12[SV * SV];   /* exact P(t1, t2) */
    double p3[SV];         /* exact P(t3) */
} small_model;

/* The exact distribution of the next three tokens under the sampler, by enumerating forks. */
static void exact_distribution(small_model *sm, const dsv4_sampling *sp) {
    dsv4_error err;
    dsv4_sampler smp;
    if (dsv4_sampler_init(&smp, sp, SV, &err)) fail_msg("%s", err.msg);
    float lg[SV], p1[SV], p2[SV], p3[SV];
    dsv4_seq *base;
    if (dsv4_seq_new(sm->m, &base, &err)) fail_msg("%s", err.msg);
    dsv4_step_item it = { base, sm->prompt, 6, DSV4_LOGITS_LAST, lg };
    if (dsv4_step(sm->m, &it, 1, &err)) fail_msg("%s", err.msg);
    dsv4_sampler_distribution(&smp, lg, p1);
    memset(sm->p3, 0, sizeof sm->p3);
    for (int a = 0; a < SV; a++) {
        dsv4_seq *sa;
        if (dsv4_seq_fork(base, &sa, &err)) fail_msg("%s", err.msg);
        dsv4_step_item ia = { sa, &a, 1, DSV4_LOGITS_LAST, lg };
        if (dsv4_step(sm->m, &ia, 1, &err)) fail_msg("%s", err.msg);
        dsv4_sampler_distribution(&smp, lg, p2);
        for (int b = 0; b < SV; b++) {
            sm->p12[a * SV + b] = (double)p1[a] * p2[b];
            dsv4_seq *sb;
            if (dsv4_seq_fork(sa, &sb, &err)) fail_msg("%s", err.msg);
            dsv4_step_item ib = { sb, &b, 1, DSV4_LOGITS_LAST, lg };
            if (dsv4_step(sm->m, &ib, 1, &err)) fail_msg("%s", err.msg);
            dsv4_sampler_distribution(&smp, lg, p3);
            for (int c = 0; c < SV; c++) sm->p3[c] += sm->p12[a * SV + b] * p3[c];
            dsv4_seq_free(sb);
        }
        dsv4_seq_free(sa);
    }
    dsv4_seq_free(base);
    dsv4_sampler_free(&smp);
}

/* Draw N_SAMPLES three-token continuations with speculation and test them against the exact distribution. */
static void sample_and_test(small_model *sm, const dsv4_sampling *sp0, int deterministic, const char *what) {
    dsv4_error err;
    long c12[SV * SV] = {0}, c3[SV] = {0};
    long proposed = 0, accepted = 0;
    const int N_SAMPLES = n_samples();
    for (int i = 0; i < N_SAMPLES; i++) {
        dsv4_sampling sp = *sp0;
        sp.seed = 1000003ULL * (uint64_t)i + 17;
        q_ctx *qc = calloc(1, sizeof *qc);
        /* q: far from the target (most mass on tokens 0 and 7) but positive everywhere */
        const float q[SV] = {0.35f, 0.05f, 0.05f, 0.05f, 0.05f, 0.05f, 0.05f, 0.35f};
        memcpy(qc->q, q, sizeof q);
        qc->x = 0x1234567ULL + (uint64_t)i * 0x9e3779b97f4a7c15ULL;
        qc->deterministic = deterministic;
        dsv4_drafter d = { "q", qc, q_propose, NULL, free };
        dsv4_spec_opts o = { .draft = 3, .max_new_tokens = 3 };
        dsv4_spec_stream *s;
        if (dsv4_spec_stream_new(sm->m, sm->prompt, 6, &sp, &o, &d, &s, &err)) fail_msg("%s", err.msg);
        while (!dsv4_spec_stream_done(s))
            if (dsv4_spec_step(sm->m, &s, 1, &err)) fail_msg("%s", err.msg);
        int n;
        const int32_t *out = dsv4_spec_stream_output(s, &n);
        assert_int_equal(n, 3);
        c12[out[0] * SV + out[1]]++;
        c3[out[2]]++;
        dsv4_spec_stats st;
        dsv4_spec_stream_stats(s, &st);
        proposed += st.proposed;
        accepted += st.accepted;
        dsv4_spec_stream_free(s);
    }
    print_message("  %s: %ld drafts, %ld accepted (%.1f %%)\n", what, proposed, accepted, 100.0 * accepted / proposed);
    assert_true(accepted < proposed); /* rejections happened: the residual path was exercised */
    char name[64];
    snprintf(name, sizeof name, "%s P(t1,t2)", what);
    chi_square(name, c12, sm->p12, SV * SV, N_SAMPLES);
    snprintf(name, sizeof name, "%s P(t3)", what);
    chi_square(name, c3, sm->p3, SV, N_SAMPLES);
}

/* Self-draft under sampling: p_d is the target's own distribution (bit-identical logits in EXACT mode), so
 * min(1, p_t/p_d) = 1 and every draft is accepted. */
static void self_draft_sampling(small_model *sm, const dsv4_sampling *sp0) {
    dsv4_error err;
    long proposed = 0, accepted = 0;
    for (int i = 0; i < 20; i++) {
        dsv4_sampling sp = *sp0;
        sp.seed = 77 + (uint64_t)i;
        dsv4_drafter d;
        if (dsv4_drafter_self(sm->m, &sp, &d, &err)) fail_msg("%s", err.msg);
        dsv4_spec_opts o = { .draft = 4, .max_new_tokens = 40 };
        dsv4_spec_stream *s;
        if (dsv4_spec_stream_new(sm->m, sm->prompt, 6, &sp, &o, &d, &s, &err)) fail_msg("%s", err.msg);
        while (!dsv4_spec_stream_done(s))
            if (dsv4_spec_step(sm->m, &s, 1, &err)) fail_msg("%s", err.msg);
        dsv4_spec_stats st;
        dsv4_spec_stream_stats(s, &st);
        proposed += st.proposed;
        accepted += st.accepted;
        dsv4_spec_stream_free(s);
    }
    print_message("  self drafter, sampling: %ld drafts, %ld accepted\n", proposed, accepted);
    assert_true(proposed > 0);
    assert_int_equal(accepted, proposed);
}

static void sampling_lossless(void **state) {
    small_model sm = {0};
    static const char *const sets[] = {"vocab_size=8", "compress_ratios=[0,4]", "sliding_window=8"};
    sm.m = tm_make("flash-tiny", sets, 3, 99, DSV4_MODE_EXACT, sm.dir);
    assert_non_null(sm.m);
    /* the context: the stream prefills 5 tokens and verifies from the 6th, the enumeration processes all 6 */
    const int32_t pr[6] = {2, 6, 1, 4, 3, 0};
    memcpy(sm.prompt, pr, sizeof pr);
    dsv4_sampling sp = {0};
    sp.temperature = 1.0f;
    sp.top_p = 1.0f;
    exact_distribution(&sm, &sp);
    sample_and_test(&sm, &sp, 0, "q drafter");
    sample_and_test(&sm, &sp, 1, "fixed drafter");
    /* filters too: top-k 5 with temperature 0.8 */
    sp.temperature = 0.8f;
    sp.top_k = 5;
    exact_distribution(&sm, &sp);
    sample_and_test(&sm, &sp, 0, "q drafter top-k");
    self_draft_sampling(&sm, &sp);
    dsv4_model_free(sm.m);
    tm_rmdir(sm.dir);
}

/* ---- the confidence hook: only drafts whose survival product stays >= the threshold are verified -------- */

typedef struct {
    const reference *r;
    int n_done;
} conf_ctx;

static int conf_propose(void *ctx, const int32_t *history, int64_t n_hist, int32_t last, int max_k, int32_t *draft,
                        float *draft_probs, int *probs_given, float *confidence, int *conf_given, dsv4_error *err) {
    conf_ctx *c = ctx;
    const int g = (int)(n_hist + 1 - N_PROMPT); /* tokens generated so far */
    static const float conf[6] = {0.9f, 0.9f, 0.5f, 0.9f, 0.9f, 0.9f}; /* survival 0.9, 0.81, 0.405: two pass 0.5 */
    for (int j = 0; j < max_k; j++) {
        draft[j] = c->r->out[g + j];
        confidence[j] = conf[j % 6];
    }
    *probs_given = 0;
    *conf_given = 1;
    return max_k;
}

static void confidence_cut(void **state) {
    fixture *f = *state;
    dsv4_error err;
    dsv4_sampling sp = {0};
    sp.top_p = 1.0f;
    conf_ctx *cc = calloc(1, sizeof *cc);
    cc->r = &f->ref[0];
    dsv4_drafter d = { "conf", cc, conf_propose, NULL, free };
    dsv4_spec_opts o = { .draft = 6, .conf_threshold = 0.5f, .max_new_tokens = 30 };
    dsv4_spec_stream *s;
    if (dsv4_spec_stream_new(f->m, f->ref[0].prompt, N_PROMPT, &sp, &o, &d, &s, &err)) fail_msg("%s", err.msg);
    while (!dsv4_spec_stream_done(s))
        if (dsv4_spec_step(f->m, &s, 1, &err)) fail_msg("%s", err.msg);
    dsv4_spec_stats st;
    dsv4_spec_stream_stats(s, &st);
    assert_int_equal(st.steps, 10);           /* 3 tokens per step: two drafts (all right) and the bonus */
    assert_int_equal(st.proposed, 20);
    assert_int_equal(st.accepted, 20);
    int n;
    const int32_t *out = dsv4_spec_stream_output(s, &n);
    assert_int_equal(n, 30);
    assert_memory_equal(out, f->ref[0].out, sizeof(int32_t) * 30);
    dsv4_spec_stream_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_ngram),
        cmocka_unit_test(greedy_self),
        cmocka_unit_test(greedy_external_long_drafts),
        cmocka_unit_test(greedy_batched),
        cmocka_unit_test(confidence_cut),
        cmocka_unit_test(hidden_rows_reach_drafter),
        cmocka_unit_test(refusals),
        cmocka_unit_test(sampling_lossless),
    };
    return cmocka_run_group_tests_name("speculative decoding (EXACT, memcmp, chi-square)", tests, setup, teardown);
}
