/* Mixture of experts (spec §11): sqrtsoftplus router (bias-corrected top-k, or a token-id hash table on the
 * first layers), clamped SwiGLU experts, one shared expert. */
#ifndef DSV4_CORE_MOE_H
#define DSV4_CORE_MOE_H
#include "core/workspace.h"
#include "model/model.h"

/* ws->xn [T][d] -> ws->sub [T][d] for layer L. Tokens are grouped by expert so each expert's weights are read
 * once per step; each token still sums its experts in increasing expert id, whatever the grouping. */
void moe_forward(struct dsv4_model *m, const dsv4_layer *layer, dsv4_workspace *ws);
#endif
