/* How many bytes a model reads and stores: weights touched per decoded token (for bandwidth figures) and
 * KV-cache bytes per context token. */
#ifndef DSV4_MODEL_FOOTPRINT_H
#define DSV4_MODEL_FOOTPRINT_H
#include "model/model.h"

/* Weight bytes (data + scales) one decode token reads: every attention/hc/router/shared weight of every
 * layer, n_act routed experts per layer, the head, one embedding row. */
uint64_t dsv4_decode_weight_bytes(const struct dsv4_model *m);
/* The routed-expert part of it (n_act experts of every main layer). */
uint64_t dsv4_decode_routed_bytes(const struct dsv4_model *m);
/* All weight bytes of the checkpoint's backbone. */
uint64_t dsv4_total_weight_bytes(const struct dsv4_model *m);
#endif
