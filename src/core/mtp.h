/* The V4 MTP head (spec §13): from the target's final HC state of position i (before hc_head) and the token at
 * i+1, predict the token at i+2.
 *
 *   e   = rmsnorm(embed[t_{i+1}], enorm)
 *   X'  = e_proj(e) (on every stream) + h_proj(rmsnorm(X_i[s], hnorm))
 *   X'' = the MTP block (window-only attention, its own MoE and mHC) at position i
 *   logits = head . rmsnorm(hc_head_mtp(X''), mtp.norm)
 *
 * The block keeps its own window ring of MTP rows in an MTP state: a sequence of this model whose position
 * counts MTP rows (row i pairs X_i with t_{i+1}); only its layer-0 window ring is used. Rows are fed in order,
 * any number per call, with the same one-at-a-time equivalence as dsv4_step. */
#ifndef DSV4_CORE_MTP_H
#define DSV4_CORE_MTP_H
#include "dsv4.h"

/* Run MTP rows pos..pos+n-1 of `state` (a sequence from dsv4_seq_new on the same model, used only as MTP
 * state): X [n][hc*dim] the target's final HC states of those positions, next_tokens [n] the tokens that
 * follow them. logits: NULL, or [n][vocab] (want = ALL) / [vocab] (want = LAST). */
int dsv4_mtp_forward(dsv4_model *m, dsv4_seq *state, const float *X, const int32_t *next_tokens, int n,
                     dsv4_logits_want want, float *logits, dsv4_error *err);
/* 1 when the model carries a V4 MTP head. */
int dsv4_model_has_mtp(const dsv4_model *m);
#endif
