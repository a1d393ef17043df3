/* The attention sub-layer for all three layer types (spec §7–§10): window-only (ratio 0), CSA (ratio 4:
 * overlapping compressor + lightning indexer top-k) and HCA (ratio 128: every visible compressed row). */
#ifndef DSV4_CORE_ATTENTION_H
#define DSV4_CORE_ATTENTION_H
#include "core/workspace.h"
#include "model/model.h"
#include "state/kvrows.h"

/* Heads of one query a task attends together (they share the key rows: one KV head); the workspace's key scratch
 * holds this many heads' scores a thread. */
enum { ATT_GROUP = 4 };

/* ws->xn [T][d] -> ws->sub [T][d] with the weights of `ly`. Advances every sequence's layer-L state (ring,
 * compressors, rows) by its tokens of the step. (ly is &m->layers[L] for the backbone; speculative heads pass
 * their own block and the index of their state.) */
void attention_forward(struct dsv4_model *m, const dsv4_layer *ly, int L, dsv4_workspace *ws);
/* The query and key path for every token of ws->batch (at ws->batch.pos): ws->q [T][H][D] (unit-normalised,
 * rotated), ws->kv [T][D] (normalised, rotated, OFFICIAL FP8-simulated), ws->qr (the indexer's input). */
void attention_qkv(struct dsv4_model *m, const dsv4_layer *ly, dsv4_workspace *ws);
/* ws->o [T][H][D] (de-rotated head outputs) -> ws->sub [T][d] through the grouped wo_a and wo_b (spec §7.5). */
void attention_output(struct dsv4_model *m, const dsv4_layer *ly, dsv4_workspace *ws);
/* Sink softmax of one query over nk keys that are also the values (K = V): softmax over the scores
 * (q.k * scale) and one extra logit `sink` whose value is zero. `scores` is scratch of nk floats. */
void sink_attention(dsv4_mode mode, const float *q, const float *const *keys, int nk, int D, float scale, float sink,
                    float *scores, float *out);
/* sink_attention for G <= ATT_GROUP heads q[0 .. G-1] of one query over one key set in the stored format kv (V4's
 * heads share their keys, so each row is read and decoded once for the G): out[g] is sink_attention's output for
 * q[g] over the decoded keys, bit for bit, whatever G. sink[g] is head g's sink logit; P is scratch of G x nk. */
void sink_attention_heads(dsv4_mode mode, const kv_layout *kv, const float *const *q, int G, const uint8_t *const *keys,
                          int nk, float scale, const float *sink, float *P, float *const *out);
#endif
