/* Counting which routed experts a loaded model's main layers choose, over the steps it runs (`dsv4 profile`,
 * issue 15). Works on both devices: the CPU step adds to dsv4_layer.route_counts, the GPU step to a device array
 * read back at the end. Counts are integers, so they do not depend on batching or chunking. */
#ifndef DSV4_MODEL_ROUTE_COUNT_H
#define DSV4_MODEL_ROUTE_COUNT_H
#include "model/expert_profile.h"

struct dsv4_model;

/* Start counting from zero (every later step adds, per token and main layer, 1 to each distinct expert of its
 * routing row), or stop (on = 0) and free the counters. */
int model_count_routes(struct dsv4_model *m, int on, dsv4_error *err);
/* The counts so far as a profile (initialised here; the caller frees it). Needs counting on. */
int model_route_profile(struct dsv4_model *m, expert_profile *out, dsv4_error *err);
#endif
