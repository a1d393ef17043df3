/* The V4-Flash-0731 DSpark drafter (spec §14), the model side.
 *
 * Context: for every committed target position t, main_x_t = rmsnorm(main_proj(features_t), main_norm) where
 * features_t are the means over the HC streams of the target layers' outputs (dsv4_step_item.features); each
 * stage s keeps a window ring of context keys ck_t = FP8sim(rope(rmsnorm(wkv_s(main_x_t), kv_norm_s), t)).
 * Only committed positions ever enter it, so speculation never has to undo anything here.
 *
 * Drafting a block anchored at position P+1 (the first position the target has not processed): the block is
 * [anchor, noise x (gamma-1)] at positions P+1 .. P+gamma; every stage runs a window-only block whose attention
 * lets each block element see the context keys of positions max(0, P-W+1) .. P and ALL the block's own keys
 * (bidirectional, no causal mask); the last stage's hc_head gives y_j, and the LM head the draft logits U_j.
 * The Markov head then corrects U_j by the previous draft token and the confidence head scores each draft. */
#ifndef DSV4_CORE_DSPARK_H
#define DSV4_CORE_DSPARK_H
#include "dsv4.h"
#include <stddef.h>
#include <stdint.h>

typedef struct dsv4_dspark_ctx dsv4_dspark_ctx;

int  dsv4_dspark_ctx_new(dsv4_model *m, dsv4_dspark_ctx **out, dsv4_error *err);
void dsv4_dspark_ctx_free(dsv4_dspark_ctx *c);
/* Committed positions so far: the next one to commit, and the anchor position of the next block. */
int64_t dsv4_dspark_ctx_position(const dsv4_dspark_ctx *c);
/* Bytes of its context ring, and an exact copy of a context of the same model (prefix reuse: the drafter's state
 * stored beside a prefix-cache entry). */
size_t dsv4_dspark_ctx_bytes(const dsv4_dspark_ctx *c);
int  dsv4_dspark_ctx_clone(dsv4_model *m, const dsv4_dspark_ctx *src, dsv4_dspark_ctx **out, dsv4_error *err);
/* The context as bytes and back (the prefix cache's disk tier), little-endian:
 *   u32 n_stages | u32 window | u32 head_dim | u32 0 | i64 position | f32 ring[n_stages][window][head_dim]
 * (ring slot t mod window, as in memory; slots not written yet are zero). decode: a new context of m that must be
 * at position pos, or a one-line error when the bytes do not fit m's shapes or that position. */
int  dsv4_dspark_ctx_encode(const dsv4_dspark_ctx *c, void **buf, size_t *len, dsv4_error *err);
int  dsv4_dspark_ctx_decode(dsv4_model *m, const void *buf, size_t len, int64_t pos, dsv4_dspark_ctx **out, dsv4_error *err);
/* Commit positions pos .. pos+n-1 given their target features [n][n_targets*dim]. */
int  dsv4_dspark_commit(dsv4_model *m, dsv4_dspark_ctx *c, const float *features, int n, dsv4_error *err);

/* Block size gamma (drafts per block) and Markov rank. */
int  dsv4_dspark_block_size(const dsv4_model *m);
int  dsv4_dspark_rank(const dsv4_model *m);

/* Run the block for `anchor` at the context's position: y [gamma][dim] (the last stage's hc_head outputs,
 * before the final norm) and U [gamma][vocab] (LM head logits before the Markov correction). */
int  dsv4_dspark_block(dsv4_model *m, dsv4_dspark_ctx *c, int32_t anchor, float *y, float *U, dsv4_error *err);
/* A whole draft for `anchor` at the context's position (what the drafter proposes): the block, then for rows
 * j = 0 .. k-1 in turn (k <= block size) the Markov correction by the previous token (the anchor for row 0), the
 * draft draft[j] = draw number draw0 + j of the sampling sp from the corrected row (core/sample.h), and the
 * confidence logit conf[j] (apply a sigmoid). When not NULL: probs [k][vocab] the distributions the drafts were
 * drawn from, U [k][vocab] the corrected rows. On a cuda model all of it runs on the GPU and only these come back. */
int  dsv4_dspark_draft(dsv4_model *m, dsv4_dspark_ctx *c, int32_t anchor, int k, const dsv4_sampling *sp, uint64_t draw0,
                       int32_t *draft, float *conf, float *probs, float *U, dsv4_error *err);
/* Markov correction of one row: e = markov_w1[prev] ([rank]); U_row += markov_w2 . e. scratch: [vocab]. */
void dsv4_dspark_markov(dsv4_model *m, int32_t prev, float *U_row, float *e, float *scratch);
/* Confidence logit of a draft: proj . [y_j ; e_j] (apply a sigmoid for c_j). scratch: [dim + rank]. */
float dsv4_dspark_confidence(dsv4_model *m, const float *y_j, const float *e_j, float *scratch);
#endif
