/* A token sampler: sampling parameters (dsv4_sampling, dsv4.h) plus a draw counter, over the draw that
 * core/sample.h defines (greedy, or temperature with min-p / top-k / top-p, drawn by the exponential race of
 * the official generate.py with counter-based noise). The counter is the sampler's whole random state: draw n
 * of a stream is the same token whether it was made here, by dsv4_step on any device (dsv4_step_item.sample with
 * draw = counter), or after a save and a restore of the counter. Streams sampled side by side never influence
 * each other. */
#ifndef DSV4_ENGINE_SAMPLER_H
#define DSV4_ENGINE_SAMPLER_H
#include "core/sample.h"
#include "dsv4.h"
#include <stdint.h>

typedef struct {
    dsv4_sampling params;
    uint64_t counter;    /* draws made so far; the next draw has this number */
    sample_scratch sc;
    int vocab;
} dsv4_sampler;

int  dsv4_sampler_init(dsv4_sampler *s, const dsv4_sampling *p, int vocab, dsv4_error *err);
void dsv4_sampler_free(dsv4_sampler *s);
/* Draw the next token from one row of logits (draw number s->counter, which then advances). */
int32_t dsv4_sample(dsv4_sampler *s, const float *logits);
/* The normalized distribution the sampler draws from (after temperature and filters), into out[vocab].
 * Greedy gives a one-hot row. Used by speculative verification and tests. Draws nothing. */
void dsv4_sampler_distribution(dsv4_sampler *s, const float *logits, float *out);
#endif
