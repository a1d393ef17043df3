/* The attention sub-layer for all three layer types (spec §7–§10): window-only (ratio 0), CSA (ratio 4:
 * overlapping compressor + lightning indexer top-k) and HCA (ratio 128: every visible compressed row). */
#ifndef DSV4_CORE_ATTENTION_H
#define DSV4_CORE_ATTENTION_H
#include "core/workspace.h"
#include "model/model.h"

/* ws->xn [T][d] -> ws->sub [T][d]. Advances every sequence's layer-L state (ring, compressors, rows) by its
 * tokens of the step. */
void attention_forward(struct dsv4_model *m, int L, dsv4_workspace *ws);
#endif
