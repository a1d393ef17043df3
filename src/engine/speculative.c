/* Speculative step and verification (spec §14.7): see speculative.h for the protocol. */
#include "engine/speculative.h"
#include "model/model.h" /* max_spec: the ring slack that bounds how many tokens a rollback may undo */
#include "util/error.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- randomness of the acceptance test: xoshiro256**, independent of the sampler's own stream ---------- */

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t rng_next(uint64_t *s) {
    const uint64_t r = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl64(s[3], 45);
    return r;
}
/* Uniform in [0, 1) with 53 bits. */
static double rng_uniform(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

static void rng_seed(uint64_t *s, uint64_t seed) {
    uint64_t x = seed ^ 0x5bd1e9955bd1e995ULL; /* not the sampler's stream: acceptance draws stay independent */
    for (int i = 0; i < 4; i++) {
        uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        s[i] = z ^ (z >> 31);
    }
}

/* An exact categorical draw from w[0..n) (non-negative, sum > 0 not required to be 1): inverse CDF in double. */
static int32_t draw_categorical(const float *w, int n, uint64_t *rng) {
    double total = 0;
    int32_t last_nz = -1;
    for (int i = 0; i < n; i++)
        if (w[i] > 0.0f) { total += w[i]; last_nz = i; }
    if (last_nz < 0) return 0;
    const double u = rng_uniform(rng) * total;
    double c = 0;
    for (int i = 0; i < n; i++) {
        if (w[i] <= 0.0f) continue;
        c += w[i];
        if (u < c) return i;
    }
    return last_nz; /* rounding at the top end */
}

/* ---- verification rule (§14.7) --------------------------------------------------------------------------- */

int dsv4_spec_verify_rows(dsv4_sampler *smp, const float *rows, const int32_t *draft, int k, const float *draft_probs,
                          uint64_t rng[4], float *scratch, int32_t *bonus) {
    const int V = smp->vocab;
    const int greedy = smp->params.temperature <= 0.0f;
    float *pt = scratch, *resid = scratch + V;
    for (int j = 0; j < k; j++) {
        const float *row = rows + (size_t)j * V;
        const int32_t d = draft[j];
        if (greedy) {
            /* dsv4_sample in greedy mode is the argmax with the sampler's tie rule and draws no randomness */
            const int32_t t = dsv4_sample(smp, row);
            if (t == d) continue;
            *bonus = t;
            return j;
        }
        dsv4_sampler_distribution(smp, row, pt);
        const float *pd = draft_probs ? draft_probs + (size_t)j * V : NULL;
        const double p = pt[d], q = pd ? pd[d] : 1.0;
        /* accept with probability min(1, p/q); q <= 0 would mean the drafter drew a token it gave no mass:
         * min(1, p/0) = 1 when p > 0 */
        const double u = rng_uniform(rng);
        if (p > 0.0 && (q <= 0.0 || u * q < p)) continue;
        /* rejected: the next token comes from normalize(max(0, p_t - p_d)) */
        double mass = 0;
        for (int i = 0; i < V; i++) {
            const float qi = pd ? pd[i] : (i == d ? 1.0f : 0.0f);
            resid[i] = pt[i] > qi ? pt[i] - qi : 0.0f;
            mass += resid[i];
        }
        /* p_t <= p_d everywhere means p_t == p_d up to rounding, where rejection has probability ~0 */
        *bonus = draw_categorical(mass > 0 ? resid : pt, V, rng);
        return j;
    }
    const float *row = rows + (size_t)k * V;
    if (greedy) *bonus = dsv4_sample(smp, row);
    else {
        dsv4_sampler_distribution(smp, row, pt);
        *bonus = draw_categorical(pt, V, rng);
    }
    return k;
}

/* ---- streams ---------------------------------------------------------------------------------------------- */

struct dsv4_spec_stream {
    dsv4_model *m;
    dsv4_seq *seq;           /* every committed token but the pending one */
    int32_t pending;
    dsv4_sampler smp;
    uint64_t rng[4];
    dsv4_spec_opts o;
    dsv4_drafter dr;
    int vocab;
    int32_t *out;            /* [max_new_tokens] */
    int n_out, last_emitted;
    int done;
    dsv4_spec_stats st;
    /* per-step scratch, sized for o.draft */
    dsv4_spec_drafts d;      /* this step's anchor and drafts */
    float *logits;           /* [1 + draft][vocab] */
    float *scratch;          /* [2][vocab] */
    float *hidden;           /* [1 + draft][dr.hidden_dim] when the drafter wants target features, else NULL */
    dsv4_seq_snapshot *snap;
    dsv4_cstate *cs;         /* constraint state (NULL = unconstrained): holds the committed output */
};

void dsv4_drafter_free(dsv4_drafter *d) {
    if (!d) return;
    if (d->free) d->free(d->ctx);
    memset(d, 0, sizeof *d);
}

void dsv4_spec_stream_free(dsv4_spec_stream *s) {
    if (!s) return;
    dsv4_drafter_free(&s->dr);
    dsv4_seq_snapshot_free(s->snap);
    dsv4_seq_free(s->seq);
    dsv4_sampler_free(&s->smp);
    free(s->out);
    free(s->d.chunk);
    free(s->d.probs);
    free(s->d.conf);
    free(s->logits);
    free(s->scratch);
    free(s->hidden);
    free(s->d.cpos);
    dsv4_cstate_free(s->cs);
    free(s);
}

static int check_opts(const dsv4_model *m, const dsv4_spec_opts *o, dsv4_error *err) {
    if (o->draft < 1 || o->draft > m->max_spec - 1)
        return dsv4_fail(err, DSV4_E_ARG, "speculative: draft length %d is outside 1..%d (the model was loaded with "
                         "max_spec = %d ring slots; the anchor takes one)", o->draft, m->max_spec - 1, m->max_spec);
    if (o->max_new_tokens < 0) return dsv4_fail(err, DSV4_E_ARG, "speculative: max_new_tokens must be >= 0");
    if (!(o->conf_threshold >= 0.0f && o->conf_threshold <= 1.0f))
        return dsv4_fail(err, DSV4_E_ARG, "speculative: confidence threshold must be in [0, 1]");
    return 0;
}

/* Point a step item's feature output at the stream's buffer: the final HC states (V4 MTP) or the DSpark
 * context features, whichever the drafter asked for. */
static void feature_outputs(dsv4_spec_stream *s, dsv4_step_item *it) {
    if (!s->hidden) return;
    if (s->dr.dspark_features) it->features = s->hidden;
    else it->hidden = s->hidden;
}

/* Process prompt[0..n-1) (the last prompt token stays pending) and report it to the drafter like a commit:
 * rows prompt[0..n-1), committed tokens prompt[1..n). One step when the drafter wants no target features,
 * otherwise chunks that fit the hidden buffer. */
static int prefill(dsv4_spec_stream *s, const int32_t *prompt, int n_prompt, dsv4_error *err) {
    const int n = n_prompt - 1, chunk = s->hidden ? DSV4_SPEC_PREFILL_CHUNK : n;
    for (int p0 = 0; p0 < n; p0 += chunk) {
        const int len = n - p0 < chunk ? n - p0 : chunk;
        dsv4_step_item it = { s->seq, prompt + p0, len, DSV4_LOGITS_NONE, NULL, NULL };
        feature_outputs(s, &it);
        int rc = dsv4_step(s->m, &it, 1, err);
        if (rc) return dsv4_wrap(err, "speculative: prefill");
        if (!s->dr.on_commit) continue;
        const dsv4_spec_verify_info vi = { p0, len, len, s->vocab, NULL, s->hidden, s->hidden ? s->dr.hidden_dim : 0 };
        if ((rc = s->dr.on_commit(s->dr.ctx, prompt + p0 + 1, len, &vi, err)))
            return dsv4_wrap(err, "drafter %s: prompt", s->dr.name ? s->dr.name : "?");
    }
    return 0;
}

int dsv4_spec_stream_new(dsv4_model *m, const int32_t *prompt, int n_prompt, const dsv4_sampling *sp,
                         const dsv4_spec_opts *o, dsv4_drafter *drafter, dsv4_spec_stream **out, dsv4_error *err) {
    dsv4_drafter dr = {0};
    if (drafter) { dr = *drafter; memset(drafter, 0, sizeof *drafter); }
    if (!m || !prompt || !sp || !o || !out || !dr.propose) {
        dsv4_drafter_free(&dr);
        return dsv4_fail(err, DSV4_E_ARG, "speculative: missing model, prompt, options or drafter");
    }
    if (n_prompt < 1) { dsv4_drafter_free(&dr); return dsv4_fail(err, DSV4_E_ARG, "speculative: empty prompt"); }
    int rc = check_opts(m, o, err);
    if (rc) { dsv4_drafter_free(&dr); return rc; }
    dsv4_spec_stream *s = calloc(1, sizeof *s);
    if (!s) { dsv4_drafter_free(&dr); return dsv4_fail(err, DSV4_E_NOMEM, "speculative: out of memory"); }
    s->dr = dr;
    s->m = m;
    s->o = *o;
    s->vocab = m->cfg.vocab_size;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= s->vocab) {
            dsv4_fail(err, DSV4_E_ARG, "speculative: prompt token %d (id %d) is outside the vocabulary (%d)", i,
                      prompt[i], s->vocab);
            dsv4_spec_stream_free(s);
            return DSV4_E_ARG;
        }
    if ((rc = dsv4_sampler_init(&s->smp, sp, s->vocab, err))) { dsv4_spec_stream_free(s); return rc; }
    rng_seed(s->rng, sp->seed);
    const size_t V = (size_t)s->vocab, K = (size_t)o->draft;
    s->out = malloc(sizeof(int32_t) * ((size_t)o->max_new_tokens + 1));
    s->d.chunk = malloc(sizeof(int32_t) * (K + 2)); /* + the bonus, written after the drafts at commit */
    s->d.probs = malloc(sizeof(float) * K * V);
    s->d.conf = malloc(sizeof(float) * K);
    s->logits = malloc(sizeof(float) * (K + 1) * V);
    s->scratch = malloc(sizeof(float) * 2 * V);
    if (dr.hidden_dim > 0) {
        const int exported = dr.dspark_features ? m->cfg.n_dspark_targets * m->cfg.dim : m->cfg.hc_mult * m->cfg.dim;
        if (dr.hidden_dim != exported) {
            dsv4_fail(err, DSV4_E_ARG, "speculative: drafter %s wants %d floats of target features per position; "
                      "the step exports %d", dr.name ? dr.name : "?", dr.hidden_dim, exported);
            dsv4_spec_stream_free(s); /* frees the drafter: its name is used above, before */
            return DSV4_E_ARG;
        }
        const size_t rows = (K + 1) > DSV4_SPEC_PREFILL_CHUNK ? (K + 1) : DSV4_SPEC_PREFILL_CHUNK;
        s->hidden = malloc(sizeof(float) * rows * (size_t)dr.hidden_dim);
        if (!s->hidden) { dsv4_spec_stream_free(s); return dsv4_fail(err, DSV4_E_NOMEM, "speculative: out of memory"); }
    }
    if (!s->out || !s->d.chunk || !s->d.probs || !s->d.conf || !s->logits || !s->scratch) {
        dsv4_spec_stream_free(s);
        return dsv4_fail(err, DSV4_E_NOMEM, "speculative: out of memory");
    }
    if (o->grammar || o->cvocab || o->matcher) {
        if (!o->matcher && (!o->grammar || !o->cvocab)) {
            dsv4_spec_stream_free(s);
            return dsv4_fail(err, DSV4_E_ARG, "speculative: a constraint needs a grammar and a vocabulary (or a matcher)");
        }
        const dsv4_cvocab *cv = o->matcher ? dsv4_cmatcher_vocab(o->matcher) : o->cvocab;
        if (dsv4_cvocab_size(cv) != s->vocab || dsv4_cvocab_eos(cv) != m->cfg.eos_id) {
            dsv4_spec_stream_free(s);
            return dsv4_fail(err, DSV4_E_ARG, "speculative: the constraint's vocabulary does not match the model");
        }
        const int64_t bound = (int64_t)o->max_new_tokens - 1;
        if ((rc = o->matcher ? dsv4_cstate_new_shared(o->matcher, bound, &s->cs, err) : dsv4_cstate_new(o->grammar, o->cvocab, bound, &s->cs, err))) {
            dsv4_spec_stream_free(s);
            return rc;
        }
        if (!(s->d.cpos = malloc(sizeof *s->d.cpos * (K + 1)))) { dsv4_spec_stream_free(s); return dsv4_fail(err, DSV4_E_NOMEM, "speculative: out of memory"); }
    }
    if ((rc = dsv4_seq_new(m, &s->seq, err))) { dsv4_spec_stream_free(s); return rc; }
    if (n_prompt > 1 && (rc = prefill(s, prompt, n_prompt, err))) {
        dsv4_spec_stream_free(s);
        return rc;
    }
    s->pending = prompt[n_prompt - 1];
    s->done = o->max_new_tokens == 0;
    *out = s;
    return 0;
}

/* Keep the drafts whose survival product prod_{i<=j} c_i stays >= threshold (DSpark scheduling). */
static int cut_by_confidence(const float *conf, int k, float threshold) {
    double survival = 1.0;
    for (int j = 0; j < k; j++) {
        survival *= conf[j];
        if (survival < threshold) return j;
    }
    return k;
}

void dsv4_spec_rng_seed(uint64_t rng[4], uint64_t seed) { rng_seed(rng, seed); }

int dsv4_spec_draft(dsv4_drafter *dr, const dsv4_sampler *smp, dsv4_cstate *cs, const dsv4_seq *seq, int32_t pending,
                    int max_k, float conf_threshold, int vocab, dsv4_spec_drafts *d, dsv4_error *err) {
    const char *name = dr->name ? dr->name : "?";
    d->k = 0;
    d->probs_given = 0;
    d->chunk[0] = pending;
    d->n_valid = 0;
    if (cs) d->cpos[0] = dsv4_cstate_get(cs); /* row 0 is masked at the committed position */
    if (max_k < 1) return 0;
    const int greedy = smp->params.temperature <= 0.0f;
    int conf_given = 0;
    const int n = dr->propose(dr->ctx, dsv4_seq_tokens(seq), dsv4_seq_position(seq), pending, max_k, d->chunk + 1,
                              greedy ? NULL : d->probs, &d->probs_given, d->conf, &conf_given, err);
    if (n < 0) return dsv4_wrap(err, "drafter %s", name);
    if (n > max_k) return dsv4_fail(err, DSV4_E_STATE, "drafter %s proposed %d tokens, more than the %d asked", name, n, max_k);
    for (int j = 0; j < n; j++)
        if (d->chunk[1 + j] < 0 || d->chunk[1 + j] >= vocab)
            return dsv4_fail(err, DSV4_E_ARG, "drafter %s: draft %d (id %d) is outside the vocabulary (%d)", name, j,
                             d->chunk[1 + j], vocab);
    d->k = conf_given && conf_threshold > 0.0f ? cut_by_confidence(d->conf, n, conf_threshold) : n;
    if (greedy) d->probs_given = 0;
    if (cs) {
        /* walk the constraint along the drafts: cpos[j] is the position row j is masked with */
        const dsv4_cpos p0 = dsv4_cstate_get(cs);
        int j = 0;
        while (j < d->k && dsv4_cstate_allows(cs, d->chunk[1 + j])) {
            if (dsv4_cstate_advance(cs, d->chunk[1 + j], err)) { dsv4_cstate_set(cs, p0); return dsv4_wrap(err, "speculative"); }
            d->cpos[++j] = dsv4_cstate_get(cs);
        }
        dsv4_cstate_set(cs, p0);
        d->n_valid = j;
        if (!d->probs_given) d->k = j; /* deterministic drafts: a refused draft would be rejected for sure */
    }
    return 0;
}

int dsv4_spec_mask_rows(dsv4_cstate *cs, const dsv4_spec_drafts *d, float *rows, int vocab, dsv4_error *err) {
    if (!cs) return 0;
    /* row j predicts the token after d_j: mask it with the constraint at that position. Rows after the first
     * refused draft are never read (verification rejects that draft: its probability is 0). */
    for (int j = 0; j <= d->n_valid && j <= d->k; j++) {
        dsv4_cstate_set(cs, d->cpos[j]);
        int rc = dsv4_cstate_mask(cs, rows + (size_t)j * (size_t)vocab, err);
        if (rc) return rc;
    }
    return 0;
}

/* Ask the stream's drafter for this step's drafts (s->d). */
static int gather_drafts(dsv4_spec_stream *s, dsv4_error *err) {
    const int remaining = s->o.max_new_tokens - s->n_out;
    const int max_k = s->o.draft < remaining - 1 ? s->o.draft : remaining - 1; /* the bonus is one more token */
    return dsv4_spec_draft(&s->dr, &s->smp, s->cs, s->seq, s->pending, max_k, s->o.conf_threshold, s->vocab, &s->d, err);
}

/* Verify, roll back the rejected positions, emit, tell the drafter. */
static int commit_stream(dsv4_spec_stream *s, dsv4_error *err) {
    int32_t bonus;
    int rc;
    if ((rc = dsv4_spec_mask_rows(s->cs, &s->d, s->logits, s->vocab, err))) {
        s->done = 1;
        return dsv4_wrap(err, "speculative");
    }
    const int n_acc = dsv4_spec_verify_rows(&s->smp, s->logits, s->d.chunk + 1, s->d.k,
                                            s->d.probs_given ? s->d.probs : NULL, s->rng, s->scratch, &bonus);
    /* committed tokens d_1..d_{n_acc}, bonus: written over chunk[1..] (chunk[0] is the old anchor) */
    int32_t *c = s->d.chunk + 1;
    c[n_acc] = bonus;
    int t = n_acc + 1;
    int stop = 0;
    if (s->o.stop_on_eos || s->cs) {
        const int eos = s->m->cfg.eos_id;
        for (int i = 0; i < t; i++)
            if (c[i] == eos) { t = i + 1; stop = 1; break; }
    }
    if (s->cs) {
        /* the committed output is d_1..d_{t-1} then c_{t-1}: the drafts' positions are known, the last token
         * (the bonus, or an accepted EOS) advances from there */
        dsv4_cstate_set(s->cs, s->d.cpos[t - 1]);
        if ((rc = dsv4_cstate_advance(s->cs, c[t - 1], err))) { s->done = 1; return dsv4_wrap(err, "speculative"); }
    }
    /* keep the anchor and c_0..c_{t-2}; c_{t-1} is the new pending token */
    rc = dsv4_seq_rollback(s->seq, s->snap, t, err);
    if (rc) { s->done = 1; return dsv4_wrap(err, "speculative: rollback"); }
    memcpy(s->out + s->n_out, c, sizeof(int32_t) * (size_t)t);
    s->n_out += t;
    s->last_emitted = t;
    s->pending = c[t - 1];
    s->st.steps++;
    s->st.proposed += s->d.k;
    s->st.accepted += n_acc < t ? n_acc : t; /* an EOS among the drafts ends the output early */
    s->st.emitted += t;
    if (stop || s->n_out >= s->o.max_new_tokens) s->done = 1;
    if (s->dr.on_commit) {
        const dsv4_spec_verify_info vi = { dsv4_seq_position(s->seq) - t, s->d.k + 1, t, s->vocab, s->logits, s->hidden,
                                           s->hidden ? s->dr.hidden_dim : 0 };
        if ((rc = s->dr.on_commit(s->dr.ctx, c, t, &vi, err)))
            return dsv4_wrap(err, "drafter %s: commit", s->dr.name ? s->dr.name : "?");
    }
    return 0;
}

int dsv4_spec_step(dsv4_model *m, dsv4_spec_stream **streams, int n_streams, dsv4_error *err) {
    if (!m || (n_streams > 0 && !streams) || n_streams < 0) return dsv4_fail(err, DSV4_E_ARG, "speculative step: bad arguments");
    dsv4_step_item *items = calloc((size_t)(n_streams > 0 ? n_streams : 1), sizeof *items);
    dsv4_spec_stream **act = calloc((size_t)(n_streams > 0 ? n_streams : 1), sizeof *act);
    int rc = 0, n = 0;
    if (!items || !act) { rc = dsv4_fail(err, DSV4_E_NOMEM, "speculative step: out of memory"); goto out; }
    for (int i = 0; i < n_streams; i++) {
        dsv4_spec_stream *s = streams[i];
        if (!s || s->m != m) { rc = dsv4_fail(err, DSV4_E_ARG, "speculative step: stream %d is missing or of another model", i); goto out; }
        for (int j = 0; j < n; j++)
            if (act[j] == s) { rc = dsv4_fail(err, DSV4_E_ARG, "speculative step: stream %d appears twice", i); goto out; }
        if (s->done) continue;
        if ((rc = gather_drafts(s, err))) { dsv4_wrap(err, "stream %d", i); goto out; }
        dsv4_seq_snapshot_free(s->snap);
        s->snap = NULL;
        if ((rc = dsv4_seq_snapshot_new(s->seq, &s->snap, err))) goto out;
        items[n] = (dsv4_step_item){ s->seq, s->d.chunk, 1 + s->d.k, DSV4_LOGITS_ALL, s->logits, NULL };
        feature_outputs(s, &items[n]);
        act[n++] = s;
    }
    if (n == 0) goto out;
    /* the whole verification of every stream is this one forward call */
    if ((rc = dsv4_step(m, items, n, err))) { dsv4_wrap(err, "speculative step: target forward"); goto out; }
    for (int j = 0; j < n; j++) {
        dsv4_error e2;
        int r = commit_stream(act[j], rc ? &e2 : err);
        if (r && !rc) rc = r; /* report the first failure; the other streams still commit */
    }
out:
    for (int j = 0; j < n; j++) { dsv4_seq_snapshot_free(act[j]->snap); act[j]->snap = NULL; }
    free(items);
    free(act);
    return rc;
}

int dsv4_spec_stream_done(const dsv4_spec_stream *s) { return s->done; }
const int32_t *dsv4_spec_stream_output(const dsv4_spec_stream *s, int *n) { if (n) *n = s->n_out; return s->out; }
int dsv4_spec_stream_last_emitted(const dsv4_spec_stream *s) { return s->last_emitted; }
void dsv4_spec_stream_stats(const dsv4_spec_stream *s, dsv4_spec_stats *st) { *st = s->st; }
const dsv4_seq *dsv4_spec_stream_seq(const dsv4_spec_stream *s) { return s->seq; }
int32_t dsv4_spec_stream_pending(const dsv4_spec_stream *s) { return s->pending; }
dsv4_drafter *dsv4_spec_stream_drafter(dsv4_spec_stream *s) { return &s->dr; }
