/* How many bytes a model reads and stores: weights touched per decoded token (for bandwidth figures) and
 * KV-cache bytes per context token. */
#ifndef DSV4_MODEL_FOOTPRINT_H
#define DSV4_MODEL_FOOTPRINT_H
#include "model/model.h"

/* Weight bytes (data + scales) one decode token reads: every attention/hc/router/shared weight of every
 * layer, n_act routed experts per layer, the head, one embedding row. */
uint64_t dsv4_decode_weight_bytes(const struct dsv4_model *m);
/* The part of it that every step reads whatever the routing (all but the routed experts). */
uint64_t dsv4_fixed_weight_bytes(const struct dsv4_model *m);
/* Weight bytes (data + scales) of routed expert e of a layer. */
uint64_t dsv4_expert_weight_bytes(const dsv4_layer *L, int e);
/* The multiply-adds (2 flops each) of one token's linears: every weight above but the embedding, each element once,
 * n_act routed experts per layer. The same for every token whatever its routing (a layer's experts have one shape),
 * so a step of n tokens does n times it; attention's own arithmetic (scores, the indexer's, which grow with the
 * context) is not in it. */
uint64_t dsv4_token_linear_flops(const struct dsv4_model *m);
/* All weight bytes of the checkpoint's backbone. */
uint64_t dsv4_total_weight_bytes(const struct dsv4_model *m);
#endif
