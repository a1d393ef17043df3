/* Mixture of experts (spec §11): sqrtsoftplus router (bias-corrected top-k, or a token-id hash table on the
 * first layers), clamped SwiGLU experts, one shared expert. */
#ifndef DSV4_CORE_MOE_H
#define DSV4_CORE_MOE_H
#include "core/workspace.h"
#include "model/model.h"

/* ws->xn [T][d] -> ws->sub [T][d] for layer L. Tokens are grouped by expert so each expert's weights are read
 * once per step; each token still sums its experts in increasing expert id, whatever the grouping. */
void moe_forward(struct dsv4_model *m, const dsv4_layer *layer, dsv4_workspace *ws);

/* The routed (token, expert) pair rows one grouped expert run holds at once (core/moe_experts.h), for a step of
 * T tokens and K experts a token: all T*K while that is small (decode, many streams: the whole layer in two
 * pool dispatches), at most max(T, MOE_GROUP_PAIRS) beyond, so that a long prefill's buffers stay near the
 * [T] ones (one expert's up to T rows always fit). */
enum { MOE_GROUP_PAIRS = 512 };
static inline int moe_pair_cap(int T, int K) {
    const int64_t all = (int64_t)T * K, most = T > MOE_GROUP_PAIRS ? T : MOE_GROUP_PAIRS;
    return (int)(all < most ? all : most);
}

/* Slot j of a routing row names its expert for the first time (a row naming an expert twice computes it once,
 * as the official indexed update keeps one write). */
static inline int moe_first_slot(const int32_t *row, int j) {
    for (int q = 0; q < j; q++)
        if (row[q] == row[j]) return 0;
    return 1;
}

/* ---- the host's share of a GPU step (issue 15: experts in host memory) --------------------------------------
 * A step's (token, expert) pairs are numbered by expert, then token: expert e's pairs are first[e] ..
 * first[e+1]-1 in increasing token order, first[E] pairs in all — the numbering of the GPU's plan (cuda
 * k_moe_plan), so rows the host computes land where the GPU's combine reads them. */

/* first[0..E] from the routing [T][K]; returns the number of pairs. */
int moe_pair_offsets(const int32_t *route_e, int T, int K, int E, int32_t *first);

typedef struct {
    int T_cap, pair_cap;    /* for steps of up to T_cap tokens; pair rows held at once (moe_pair_cap) */
    float *xq;              /* [T][d] the inputs, quantized once per token (OFFICIAL) */
    float *x, *g, *v, *w;   /* per pair row: gathered inputs [cap][d], gate / up [cap][I], routing weights [cap] */
    int32_t *first;         /* [E + 1] */
} moe_host_scratch;
int  moe_host_scratch_init(moe_host_scratch *scr, const dsv4_config *c, int T);
void moe_host_scratch_free(moe_host_scratch *scr);

/* The rows of the experts with owner[e] == EXPERT_ON_HOST (a layer's row of model/expert_place.h's map: experts
 * on the GPU or read by it over the bus are not the host's), and of the pairs of EXPERT_ON_SPLIT experts that the
 * token split's rule at split_pct leaves to the host (model/expert_split.h), computed by the CPU kernels (the CPU
 * step's expert, in its numeric mode): experts in increasing id, each one's pairs in increasing token, packed into
 * rows [n][d] with pair[i] the pair index of rows[i]. xn [T][d] are the layer's normalised inputs (unquantized:
 * OFFICIAL mode quantizes them here as the GPU does), route_e / route_w [T][K] the routing. Returns n. */
int moe_host_rows(struct dsv4_model *m, const dsv4_layer *layer, const uint8_t *owner, int split_pct, const float *xn,
                  const int32_t *route_e, const float *route_w, int T, moe_host_scratch *scr, float *rows, int32_t *pair);
#endif
