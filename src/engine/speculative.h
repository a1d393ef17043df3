/* Lossless speculative decoding (spec §14.7, §15.4) over the one forward primitive.
 *
 * Loop state of a stream (a "spec stream"): its sequence has processed every committed token except the
 * last one, the pending token `a` (the anchor). One speculative step per stream:
 *   1. a drafter proposes d_1..d_k continuing (history, a);
 *   2. snapshot the sequence, then the target processes [a, d_1..d_k] — all streams in ONE ragged dsv4_step
 *      with DSV4_LOGITS_ALL (row j = the target's logits after d_j, row 0 after a);
 *   3. verification: greedy accepts the longest prefix with d_j == argmax(row j-1) and emits argmax(row n_acc)
 *      as the bonus; sampling accepts d_j with probability min(1, p_t(d_j)/p_d(d_j)), on rejection draws from
 *      normalize(max(0, p_t - p_d)), and if all k are accepted draws the bonus from p_t (row k). p_t is the
 *      sampler's filtered distribution (dsv4_sampler_distribution), p_d the drafter's (a one-hot at d_j when
 *      the drafter gives none: a deterministic drafter);
 *   4. dsv4_seq_rollback(keep = 1 + n_acc): the sequence holds exactly a, d_1..d_{n_acc}; the bonus is the new
 *      pending token. Output of the step: d_1..d_{n_acc}, bonus (1..k+1 tokens).
 * The output distribution equals plain sampling (greedy: the same tokens), whatever the drafter proposes.
 *
 * Ownership: a stream borrows its model, sampler parameters are copied, the drafter is owned by the stream
 * (freed with it). Several streams may share one dsv4_spec_step call; each is verified and rolled back on its
 * own. Not thread-safe: one step at a time per model (dsv4_step uses the model's workspace). */
#ifndef DSV4_ENGINE_SPECULATIVE_H
#define DSV4_ENGINE_SPECULATIVE_H
#include "dsv4.h"
#include "engine/constraint.h"
#include "engine/sampler.h"
#include <stdint.h>

struct prefix_companion;
struct prefix_codec;

/* What the verification step tells a drafter after committing (extension point for MTP / DSpark).
 * Row r is the target's output for position pos0 + r (row 0 = the anchor); committed[r] (on_commit) is the
 * token that follows row r's token, so rows 0..n_processed-1 pair with committed[0..n_processed-1].
 * `hidden` holds per-row target features when the drafter asked for them (dsv4_drafter.hidden_dim > 0):
 * today the final HC state before hc_head that dsv4_step exports (dsv4_step_item.hidden, what V4 MTP drafts
 * from); DSpark's captured layer means (§14.3) would come the same way once dsv4_step exports them. Only the
 * committed rows may enter a drafter's own rings (DSpark context keys, §15.4).
 * The prompt is reported the same way, once, when the stream is created (logits NULL, all rows committed,
 * in chunks of at most DSV4_SPEC_PREFILL_CHUNK rows when hidden rows are wanted). */
#define DSV4_SPEC_PREFILL_CHUNK 256
typedef struct {
    int64_t pos0;            /* position of row 0 (the anchor) */
    int n_rows;              /* 1 + k: rows the target computed */
    int n_processed;         /* rows committed and kept in the target's state (1 + n_acc, or fewer at a stop) */
    int vocab;
    const float *logits;     /* [n_rows][vocab], valid during the call; NULL for the prompt */
    const float *hidden;     /* [n_rows][hidden_dim] per-position target features, or NULL (none asked) */
    int hidden_dim;
} dsv4_spec_verify_info;

/* A drafter. Its context belongs to one stream. All hooks but propose may be NULL. */
typedef struct dsv4_drafter {
    const char *name;
    void *ctx;
    /* Propose up to max_k (>= 1) draft tokens continuing history[0..n_hist) followed by `last` (the pending
     * token, not yet processed by the target). Writes draft[0..n) and returns n (0..max_k), or a negative
     * dsv4_status with err set.
     * draft_probs: NULL for greedy verification; otherwise [max_k][vocab] that the drafter fills with the
     *   distribution each draft was drawn from, p_d(. | history, last, d_<j) — or leaves *probs_given = 0 to
     *   say its drafts are deterministic (p_d one-hot), which is always lossless.
     * confidence: NULL or [max_k]: the drafter may write c_j in (0, 1] per draft and set *conf_given = 1;
     *   the step then verifies only the drafts whose survival product prod_{i<=j} c_i stays >= the stream's
     *   threshold (DSpark scheduling, §14.1). Unused by the built-in drafters. */
    int (*propose)(void *ctx, const int32_t *history, int64_t n_hist, int32_t last, int max_k, int32_t *draft,
                   float *draft_probs, int *probs_given, float *confidence, int *conf_given, dsv4_error *err);
    /* After verification: committed[0..n_committed) are the tokens the step emitted (accepted drafts, then
     * the bonus, which is the new pending token). Stateful drafters update their own state here. */
    int (*on_commit)(void *ctx, const int32_t *committed, int n_committed, const dsv4_spec_verify_info *vi,
                     dsv4_error *err);
    void (*free)(void *ctx);
    /* Floats per position of target features the drafter needs in on_commit (0 = none): hc_mult * dim for the
     * final HC state (dsv4_step_item.hidden, V4 MTP), or n_targets * dim with dspark_features set for the DSpark
     * context features (dsv4_step_item.features). */
    int hidden_dim;
    int dspark_features;
    /* Prefix reuse (optional, both or neither; scheduler.h, state/prefix_companion.h). A drafter whose state is
     * built from the target's rows of every committed position cannot be rebuilt from a cached target state
     * alone, so its state is stored beside the cache's entry. prefix_save: a new companion holding the drafter's
     * state as far as it depends on positions 0..P-1 only (P: the target's position, which every row up to P - 1
     * has reached through on_commit). prefix_load: into a fresh drafter of a stream forked at P, with `next` the
     * token at P (the next prompt token or the anchor); afterwards the drafter must be bit for bit what feeding it
     * rows 0..P-1 with the tokens 1..P would have made it. The companion's kind is the drafter's name. */
    int (*prefix_save)(void *ctx, struct prefix_companion **out, dsv4_error *err);
    int (*prefix_load)(void *ctx, const struct prefix_companion *st, int32_t next, dsv4_error *err);
    /* Optional with the two above: how the saved state becomes bytes and back, so that the cache's disk tier can
     * keep it beside the state file (state/prefix_companion.h; NULL: the state is reused from memory only). The
     * companions prefix_save makes carry the same codec. */
    const struct prefix_codec *prefix_codec;
} dsv4_drafter;

/* ---- built-in drafters (no extra weights) ------------------------------------------------------------- */

/* Prompt lookup: the longest suffix of (history, last) of length max_ngram down to min_ngram that occurred
 * before; proposes the tokens that followed its most recent earlier occurrence. Deterministic. */
int dsv4_drafter_ngram(int min_ngram, int max_ngram, dsv4_drafter *out, dsv4_error *err);

/* Self-draft: drafts with the target model itself on a private sequence that mirrors the stream (rebuilt
 * by prefill when it does not match the history). With the stream's sampling parameters: greedy drafts are
 * argmax (100 % acceptance under greedy verification); sampled drafts come from the target's own filtered
 * distribution (p_d = p_t, so every draft is accepted too). Proves the verify path; costs a target pass. */
int dsv4_drafter_self(dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err);

/* Caller-supplied drafts: the next propose returns what dsv4_drafter_external_set gave (once; afterwards
 * nothing until set again). probs: NULL (deterministic drafts) or [n][vocab], copied. */
int dsv4_drafter_external(int vocab, dsv4_drafter *out, dsv4_error *err);
int dsv4_drafter_external_set(dsv4_drafter *d, const int32_t *tokens, int n, const float *probs, dsv4_error *err);

void dsv4_drafter_free(dsv4_drafter *d);

/* ---- streams -------------------------------------------------------------------------------------------- */

typedef struct dsv4_spec_stream dsv4_spec_stream;

typedef struct {
    int draft;               /* drafts per step, 1 .. max_spec - 1 (the anchor takes one ring slot too) */
    float conf_threshold;    /* survival-product threshold for drafters that give confidences; 0 = off */
    int max_new_tokens;      /* >= 0 */
    int stop_on_eos;
    /* Constrained output (constraint.h), NULL = none; borrowed, must outlive the stream. The stream keeps its
     * own state (length bound max_new_tokens - 1 bytes). Verification samples from the masked rows: the state
     * is walked along the drafts before the target step and each row gets the mask of the position it
     * predicts; a draft the constraint refuses is rejected. Greedy drafts (and deterministic drafts) are cut
     * at the first refused one before the target step, which changes nothing in the result (a one-hot p_d
     * rejected with p_t(d) = 0 leaves the residual p_t); sampled drafts with a distribution are left for the
     * acceptance test to reject, which keeps the output distribution exact. EOS ends a constrained stream. */
    const dsv4_grammar *grammar;
    const dsv4_cvocab *cvocab;
    dsv4_cmatcher *matcher;  /* or a shared matcher (borrowed; grammar and cvocab may then be NULL) */
} dsv4_spec_opts;

typedef struct {
    int64_t steps;           /* target steps this stream took part in */
    int64_t proposed;        /* drafts verified */
    int64_t accepted;        /* drafts accepted */
    int64_t emitted;         /* tokens output (accepted drafts + bonus tokens) */
} dsv4_spec_stats;

/* A stream for prompt[0..n_prompt) (n_prompt >= 1): prefills prompt[0..n-1) and keeps the last prompt token
 * pending, so the first step already speculates. Takes ownership of *drafter (also on failure: it is freed);
 * the caller's struct is zeroed. */
int  dsv4_spec_stream_new(dsv4_model *m, const int32_t *prompt, int n_prompt, const dsv4_sampling *sp,
                          const dsv4_spec_opts *o, dsv4_drafter *drafter, dsv4_spec_stream **out, dsv4_error *err);
void dsv4_spec_stream_free(dsv4_spec_stream *s);

/* One speculative step for every unfinished stream given (each at most once), in one ragged dsv4_step.
 * On error the streams' committed state is unchanged when the failure came before the target step; a failed
 * rollback leaves that stream marked failed (dsv4_spec_stream_done returns 1) and is reported. */
int  dsv4_spec_step(dsv4_model *m, dsv4_spec_stream **streams, int n_streams, dsv4_error *err);

int  dsv4_spec_stream_done(const dsv4_spec_stream *s);
/* Generated tokens so far (owned by the stream, valid until its next step). */
const int32_t *dsv4_spec_stream_output(const dsv4_spec_stream *s, int *n);
/* Tokens the last step emitted (a suffix of the output). */
int  dsv4_spec_stream_last_emitted(const dsv4_spec_stream *s);
void dsv4_spec_stream_stats(const dsv4_spec_stream *s, dsv4_spec_stats *st);
/* The stream's target sequence: holds every committed token but the pending one. */
const dsv4_seq *dsv4_spec_stream_seq(const dsv4_spec_stream *s);
int32_t dsv4_spec_stream_pending(const dsv4_spec_stream *s);
/* The stream's drafter (e.g. for dsv4_drafter_external_set). */
dsv4_drafter *dsv4_spec_stream_drafter(dsv4_spec_stream *s);

/* ---- the pieces of one stream's step, shared with the scheduler's speculation (scheduler.h) ------------ */

/* One step's anchor and drafts. The buffers are the caller's, sized for `draft` drafts per step. */
typedef struct {
    int32_t *chunk;          /* [2 + draft]: the anchor (pending token), the drafts (then room for the bonus) */
    float *probs;            /* [draft][vocab]: the drafts' distributions when probs_given */
    float *conf;             /* [draft] */
    dsv4_cpos *cpos;         /* [1 + draft] with a constraint (else unused): its position before row j's token */
    int k;                   /* drafts this step */
    int probs_given;         /* 0: deterministic drafts */
    int n_valid;             /* drafts the constraint allows (rows 0..n_valid get masks) */
} dsv4_spec_drafts;

/* Ask dr for up to max_k drafts continuing (the tokens seq has processed, pending), cut them by the confidence
 * threshold, and walk the constraint cs (NULL = none; its position is restored) along them. greedy sampling
 * (smp) asks for no distributions. 0, or an error (a failing drafter, drafts outside the vocabulary). */
int  dsv4_spec_draft(dsv4_drafter *dr, const dsv4_sampler *smp, dsv4_cstate *cs, const dsv4_seq *seq, int32_t pending,
                     int max_k, float conf_threshold, int vocab, dsv4_spec_drafts *d, dsv4_error *err);
/* Mask the target's rows [1 + k][vocab] with the constraint at each row's position (nothing when cs is NULL);
 * leaves cs at an arbitrary drafted position: the caller sets it to the committed one. */
int  dsv4_spec_mask_rows(dsv4_cstate *cs, const dsv4_spec_drafts *d, float *rows, int vocab, dsv4_error *err);
/* The acceptance test's random stream for a stream of this seed (independent of the sampler's own). */
void dsv4_spec_rng_seed(uint64_t rng[4], uint64_t seed);

/* ---- the verification rule alone (spec §14.7), for callers with their own loop ------------------------- */

/* Given the target's rows [k+1][vocab] for [a, d_1..d_k], decide: returns the number of accepted drafts
 * n_acc (0..k) and writes the bonus token. p_t per row comes from smp (greedy when its temperature <= 0);
 * draft_probs NULL = deterministic drafts. rng: 4 words of xoshiro256** state (advanced); scratch: [2][vocab]. */
int dsv4_spec_verify_rows(dsv4_sampler *smp, const float *rows, const int32_t *draft, int k, const float *draft_probs,
                          uint64_t rng[4], float *scratch, int32_t *bonus);
#endif
