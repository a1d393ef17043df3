/* Drawing one token from one row of logits: the definition that the CPU (sample.c) and the CUDA kernel
 * (backend/cuda/k_sample.cu) both implement, with the arithmetic of sample_math.h, so that the same logits bits,
 * parameters (dsv4_sampling) and draw number give the same token on both.
 *
 * A draw, step by step (V = vocabulary size, l = the logits row):
 *   1. v_i = l_i, except -inf for NaN and for ids >= n_allowed (when n_allowed > 0).
 *   2. Greedy (temperature <= 0), or a max v that is not finite: the token is argmax v_i, the lowest id on ties.
 *   3. w_i = sm_expf((v_i - m) * inv_t), m = max v, inv_t = 1 / max(T, 1e-5) (float, each op rounded once):
 *      w of the top token is 1, every w is in [0, 1], so float order = order of the bits of w.
 *   4. Kept set K: w_i > 0 and w_i >= min_p (min-p relative to the top token, whose w is 1).
 *   5. Rank order: w descending, then id ascending. top-k (0 < k < |K|): K = the first k of K in rank order.
 *   6. top-p (< 1): S = treesum(K), target = top_p * S (double, rounded once); K = the shortest prefix P of K in
 *      rank order with treesum(P) >= target. (treesum is monotone in the set, so the prefix is well defined, and
 *      a threshold search over (bits of w, id) finds it: what the kernel does.)
 *   7. The token is argmax over K of sm_race(w_i, key, i) = w_i / E_i (double), the lowest id on ties, with
 *      key = sm_draw_key(seed, draw).
 *
 * treesum(A), the one summation order: SM_LANES lanes; lane j holds 0.0 + w_i (as double) for the i in A with
 * i mod SM_LANES = j, added in increasing i; then for s = SM_LANES/2, ..., 2, 1: lane[j] = lane[j] + lane[j+s]
 * for j < s; the sum is lane[0]. Tokens outside A count as +0.0, which changes no partial sum, so the kernel may
 * add zeros where the CPU skips.
 *
 * The probability of token i is w_i / treesum(K) for i in K (sample_distribution), and draws with different
 * draw numbers are independent: a sampler's whole random state is its draw counter. */
#ifndef DSV4_CORE_SAMPLE_H
#define DSV4_CORE_SAMPLE_H
#include "dsv4.h"
#include <stdint.h>

typedef struct {
    int vocab;
    float *w;            /* [vocab]: the kept tokens' w, in id order */
    int32_t *ids;        /* [vocab]: their ids */
    double *lanes;       /* [SM_LANES] */
} sample_scratch;

/* The parameters' checks (the sampler's and dsv4_step's): one line in err on a bad one. */
int  sample_check(const dsv4_sampling *p, dsv4_error *err);
int  sample_scratch_init(sample_scratch *sc, int vocab);   /* 0, or -1 out of memory */
void sample_scratch_free(sample_scratch *sc);
/* Draw number `draw` of p->seed's stream from logits[vocab]. */
int32_t sample_row(const dsv4_sampling *p, uint64_t draw, const float *logits, sample_scratch *sc);
/* The distribution sample_row draws from, into out[vocab] (one-hot when greedy). */
void sample_distribution(const dsv4_sampling *p, const float *logits, sample_scratch *sc, float *out);
#endif
