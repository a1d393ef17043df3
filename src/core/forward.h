/* The pieces of the forward pass that the speculative heads reuse (dsv4_step itself is in dsv4.h). */
#ifndef DSV4_CORE_FORWARD_H
#define DSV4_CORE_FORWARD_H
#include "core/workspace.h"
#include "model/model.h"

/* Check every item of a step (sequence of this model whose state lives in mem, no sequence twice, tokens in the
 * vocabulary, no context overflow) before anything changes: T = the step's tokens, max_rows = the most
 * compressed rows any of them can see. */
int  step_validate(struct dsv4_model *m, const struct seq_mem *mem, dsv4_step_item *items, int n_items, int *T,
                   int64_t *max_rows, dsv4_error *err);
/* Validate the items, reserve every buffer (per-token scratch for scratch_rows x the step's tokens) and lay
 * out ws->batch. Nothing is modified on error; after success nothing can fail. */
int  forward_begin(struct dsv4_model *m, dsv4_step_item *items, int n_items, int scratch_rows, dsv4_error *err);
/* One block (mHC + attention + mHC + MoE) on ws->X, with the weights of `ly` and the state of layer L. */
void block_forward(struct dsv4_model *m, const dsv4_layer *ly, int L, dsv4_workspace *ws);
/* The same block with another attention (ws->xn -> ws->sub): the DSpark stages attend to their context. */
typedef void (*block_attention_fn)(struct dsv4_model *m, const dsv4_layer *ly, void *ctx, dsv4_workspace *ws);
void block_forward_with(struct dsv4_model *m, const dsv4_layer *ly, block_attention_fn attend, void *ctx,
                        dsv4_workspace *ws);
/* Hand each item its logits (head . rmsnorm(hc_head(X), norm), spec §12, one head pass for all the step's rows)
 * and hidden rows, append its tokens and advance its position. */
void forward_finish(struct dsv4_model *m, const dsv4_hc_weights *hc_head, const float *norm);
#endif
