/* Manifold-constrained hyper-connections (spec §6): the residual stream is hc parallel streams mixed by a
 * learned, Sinkhorn-normalised matrix around every sub-layer. */
#ifndef DSV4_CORE_HC_H
#define DSV4_CORE_HC_H
#include "backend/cpu/pool.h"
#include "model/model.h"

/* Per token: the mixing computed by hc_pre and consumed by hc_post. */
typedef struct {
    float post[8];
    float comb[64];   /* [j][k], row j = source stream, column k = destination stream */
} dsv4_hc_mix;

/* For T tokens of state X [T][hc*d]: u[t] = sum_i pre[i] X_i, and the post/comb to use in hc_post.
 * `scratch` holds T * mix floats. */
void hc_pre(dsv4_pool *pool, dsv4_mode mode, const dsv4_config *c, const dsv4_hc_weights *w, const float *X, int T,
            float *u, dsv4_hc_mix *mix, float *scratch);
/* X'_k = post[k] f + sum_j comb[j][k] X_j, in place on X [T][hc*d]. Both spread their per-token work over the pool
 * (hc_pre by token, hc_post by token and column block): each element's arithmetic is the same whatever the cut. */
void hc_post(dsv4_pool *pool, dsv4_mode mode, const dsv4_config *c, const float *f, const dsv4_hc_mix *mix, float *X, int T);
/* The final collapse: y = sum_i (sigmoid(...) + eps) X_i for one token. `mixbuf` holds hc floats. */
void hc_head_one(dsv4_mode mode, const dsv4_config *c, const dsv4_hc_weights *w, const float *X, float *y);
/* Sinkhorn of spec §6.2 on an n x n matrix of logits, in place. Exposed for tests. */
void hc_sinkhorn(float *C, int n, int iters, float eps);
#endif
