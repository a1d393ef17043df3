/* Drafters that need no extra weights: prompt lookup (n-gram), self-draft, caller-supplied drafts. */
#include "engine/speculative.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

/* ---- prompt lookup ---------------------------------------------------------------------------------------- */

typedef struct {
    int min_n, max_n;
} ngram_ctx;

/* The text the drafter sees: history, then last, then the drafts proposed so far (so a match near the end
 * continues into its own proposal: a loop of period p is drafted in full). */
typedef struct {
    const int32_t *hist;
    int64_t n_hist;
    int32_t last;
    const int32_t *draft;
} ngram_text;

static int32_t text_at(const ngram_text *x, int64_t i) {
    if (i < x->n_hist) return x->hist[i];
    if (i == x->n_hist) return x->last;
    return x->draft[i - x->n_hist - 1];
}

/* Start of the most recent earlier occurrence of the suffix of length n of text[0..L), or -1. */
static int64_t find_earlier(const ngram_text *x, int64_t L, int n) {
    for (int64_t s = L - n - 1; s >= 0; s--) {
        int j = 0;
        while (j < n && text_at(x, s + j) == text_at(x, L - n + j)) j++;
        if (j == n) return s;
    }
    return -1;
}

static int ngram_propose(void *ctx, const int32_t *history, int64_t n_hist, int32_t last, int max_k, int32_t *draft,
                         float *draft_probs, int *probs_given, float *confidence, int *conf_given, dsv4_error *err) {
    const ngram_ctx *c = ctx;
    ngram_text x = { history, n_hist, last, draft };
    const int64_t L = n_hist + 1;
    *probs_given = 0; /* deterministic drafts: p_d is one-hot */
    for (int n = c->max_n; n >= c->min_n; n--) {
        if (n >= L) continue;
        const int64_t s = find_earlier(&x, L, n);
        if (s < 0) continue;
        /* draft[i] = text[s + n + i]; s + n + i < L + i, so it is history, last or an earlier draft */
        for (int i = 0; i < max_k; i++) draft[i] = text_at(&x, s + n + i);
        return max_k;
    }
    return 0;
}

int dsv4_drafter_ngram(int min_ngram, int max_ngram, dsv4_drafter *out, dsv4_error *err) {
    if (!out) return dsv4_fail(err, DSV4_E_ARG, "ngram drafter: missing output");
    if (min_ngram < 1 || max_ngram < min_ngram)
        return dsv4_fail(err, DSV4_E_ARG, "ngram drafter: need 1 <= min (%d) <= max (%d)", min_ngram, max_ngram);
    ngram_ctx *c = malloc(sizeof *c);
    if (!c) return dsv4_fail(err, DSV4_E_NOMEM, "ngram drafter: out of memory");
    c->min_n = min_ngram;
    c->max_n = max_ngram;
    *out = (dsv4_drafter){ .name = "ngram", .ctx = c, .propose = ngram_propose, .on_commit = NULL, .free = free };
    return 0;
}

/* ---- self-draft --------------------------------------------------------------------------------------------- */

typedef struct {
    dsv4_model *m;
    dsv4_sampler smp;
    dsv4_seq *seq;            /* mirrors the stream: after on_commit it holds the stream's committed tokens */
    dsv4_seq_snapshot *snap;  /* taken before drafting, for on_commit's rollback */
    int64_t snap_pos;
    int n_drafted;            /* tokens the private sequence processed since snap: last, d_1..d_{k-1} */
    float *logits;            /* [vocab] */
    int vocab;
} self_ctx;

static void self_free(void *ctx) {
    self_ctx *c = ctx;
    if (!c) return;
    dsv4_seq_snapshot_free(c->snap);
    dsv4_seq_free(c->seq);
    dsv4_sampler_free(&c->smp);
    free(c->logits);
    free(c);
}

/* Make the private sequence hold exactly history[0..n_hist) (prefill from scratch when it does not). */
static int self_sync(self_ctx *c, const int32_t *history, int64_t n_hist, dsv4_error *err) {
    if (c->seq && dsv4_seq_position(c->seq) == n_hist &&
        (n_hist == 0 || !memcmp(dsv4_seq_tokens(c->seq), history, sizeof(int32_t) * (size_t)n_hist)))
        return 0;
    dsv4_seq_free(c->seq);
    c->seq = NULL;
    int rc = dsv4_seq_new(c->m, &c->seq, err);
    if (rc || n_hist == 0) return rc;
    dsv4_step_item it = { c->seq, history, (int)n_hist, DSV4_LOGITS_NONE, NULL };
    return dsv4_step(c->m, &it, 1, err);
}

static int self_propose(void *ctx, const int32_t *history, int64_t n_hist, int32_t last, int max_k, int32_t *draft,
                        float *draft_probs, int *probs_given, float *confidence, int *conf_given, dsv4_error *err) {
    self_ctx *c = ctx;
    int rc = self_sync(c, history, n_hist, err);
    if (rc) return rc;
    dsv4_seq_snapshot_free(c->snap);
    c->snap = NULL;
    if ((rc = dsv4_seq_snapshot_new(c->seq, &c->snap, err))) return rc;
    c->snap_pos = n_hist;
    c->n_drafted = 0;
    int32_t cur = last;
    for (int j = 0; j < max_k; j++) {
        dsv4_step_item it = { c->seq, &cur, 1, DSV4_LOGITS_LAST, c->logits };
        if ((rc = dsv4_step(c->m, &it, 1, err))) return rc;
        c->n_drafted++;
        /* dsv4_sample draws from exactly dsv4_sampler_distribution, which is then the p_d of this draft */
        draft[j] = dsv4_sample(&c->smp, c->logits);
        if (draft_probs) dsv4_sampler_distribution(&c->smp, c->logits, draft_probs + (size_t)j * c->vocab);
        cur = draft[j];
    }
    *probs_given = draft_probs != NULL;
    return max_k;
}

/* The stream now holds last, c_0..c_{n-2} beyond snap_pos; keep the common prefix, process the rest. */
static int self_commit(void *ctx, const int32_t *committed, int n_committed, const dsv4_spec_verify_info *vi,
                       dsv4_error *err) {
    self_ctx *c = ctx;
    if (!c->snap) return 0;
    const int32_t *mine = dsv4_seq_tokens(c->seq) + c->snap_pos; /* last, d_1, ..., n_drafted tokens */
    int keep = c->n_drafted > 0 ? 1 : 0;
    while (keep < c->n_drafted && keep < n_committed && mine[keep] == committed[keep - 1]) keep++;
    int rc = dsv4_seq_rollback(c->seq, c->snap, keep, err);
    dsv4_seq_snapshot_free(c->snap);
    c->snap = NULL;
    if (rc) return rc;
    /* the stream processed n_committed tokens since snap_pos (last and c_0..c_{n-2}); catch up on the rest */
    if (keep < n_committed && keep >= 1) {
        dsv4_step_item it = { c->seq, committed + keep - 1, n_committed - keep, DSV4_LOGITS_NONE, NULL };
        if ((rc = dsv4_step(c->m, &it, 1, err))) return rc;
    }
    /* keep == 0 (nothing drafted): the next propose re-syncs from the history */
    return 0;
}

int dsv4_drafter_self(dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err) {
    if (!m || !sp || !out) return dsv4_fail(err, DSV4_E_ARG, "self drafter: missing model, sampling or output");
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    self_ctx *c = calloc(1, sizeof *c);
    if (!c) return dsv4_fail(err, DSV4_E_NOMEM, "self drafter: out of memory");
    c->m = m;
    c->vocab = info.vocab_size;
    dsv4_sampling dsp = *sp;
    dsp.seed = sp->seed ^ 0xd1b54a32d192ed03ULL; /* its own random stream, not the verifier's */
    int rc = dsv4_sampler_init(&c->smp, &dsp, c->vocab, err);
    if (rc) { free(c); return rc; }
    c->logits = malloc(sizeof(float) * (size_t)c->vocab);
    if (!c->logits) { self_free(c); return dsv4_fail(err, DSV4_E_NOMEM, "self drafter: out of memory"); }
    *out = (dsv4_drafter){ .name = "self", .ctx = c, .propose = self_propose, .on_commit = self_commit, .free = self_free };
    return 0;
}

/* ---- caller-supplied drafts ------------------------------------------------------------------------------ */

typedef struct {
    int vocab, n, has_probs;
    int32_t *tok;
    float *probs;
} external_ctx;

static void external_free(void *ctx) {
    external_ctx *c = ctx;
    if (!c) return;
    free(c->tok);
    free(c->probs);
    free(c);
}

static int external_propose(void *ctx, const int32_t *history, int64_t n_hist, int32_t last, int max_k, int32_t *draft,
                            float *draft_probs, int *probs_given, float *confidence, int *conf_given, dsv4_error *err) {
    external_ctx *c = ctx;
    const int n = c->n < max_k ? c->n : max_k;
    if (n > 0) memcpy(draft, c->tok, sizeof(int32_t) * (size_t)n); /* tok is NULL before the first set */
    *probs_given = 0;
    if (draft_probs && c->has_probs && n > 0) {
        memcpy(draft_probs, c->probs, sizeof(float) * (size_t)n * (size_t)c->vocab);
        *probs_given = 1;
    }
    c->n = 0; /* one use per set */
    return n;
}

int dsv4_drafter_external(int vocab, dsv4_drafter *out, dsv4_error *err) {
    if (!out || vocab <= 0) return dsv4_fail(err, DSV4_E_ARG, "external drafter: missing output or vocabulary");
    external_ctx *c = calloc(1, sizeof *c);
    if (!c) return dsv4_fail(err, DSV4_E_NOMEM, "external drafter: out of memory");
    c->vocab = vocab;
    *out = (dsv4_drafter){ .name = "external", .ctx = c, .propose = external_propose, .on_commit = NULL,
                           .free = external_free };
    return 0;
}

int dsv4_drafter_external_set(dsv4_drafter *d, const int32_t *tokens, int n, const float *probs, dsv4_error *err) {
    if (!d || d->propose != external_propose) return dsv4_fail(err, DSV4_E_ARG, "external drafts: not an external drafter");
    if (n < 0 || (n > 0 && !tokens)) return dsv4_fail(err, DSV4_E_ARG, "external drafts: bad token list");
    external_ctx *c = d->ctx;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return dsv4_fail(err, DSV4_E_ARG, "external drafts: token %d (id %d) is outside the vocabulary (%d)", i,
                             tokens[i], c->vocab);
    const size_t V = (size_t)c->vocab;
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n + 1);
    float *p = probs ? malloc(sizeof(float) * (size_t)n * V + 1) : NULL;
    if (!t || (probs && !p)) { free(t); free(p); return dsv4_fail(err, DSV4_E_NOMEM, "external drafts: out of memory"); }
    if (n) memcpy(t, tokens, sizeof(int32_t) * (size_t)n);
    if (p && n) memcpy(p, probs, sizeof(float) * (size_t)n * V);
    free(c->tok);
    free(c->probs);
    c->tok = t;
    c->probs = p;
    c->n = n;
    c->has_probs = probs != NULL;
    return 0;
}
