/* Token sampling from logits: greedy, or temperature with top-k / top-p / min-p filters, drawn by the
 * exponential race of the official generate.py (argmax of p / Exp(1) noise = an exact categorical draw).
 * A sampler owns its random state, so streams sampled side by side never influence each other. */
#ifndef DSV4_ENGINE_SAMPLER_H
#define DSV4_ENGINE_SAMPLER_H
#include "dsv4.h"
#include <stdint.h>

typedef struct {
    float temperature;   /* <= 0: greedy (argmax, lowest id on ties) */
    int   top_k;         /* 0: off */
    float top_p;         /* >= 1: off */
    float min_p;         /* <= 0: off; keep tokens with p >= min_p * p_max */
    uint64_t seed;
} dsv4_sampling;

typedef struct {
    dsv4_sampling params;
    uint64_t rng[4];
    float *prob;         /* [vocab] scratch */
    int32_t *order;      /* [vocab] scratch */
    int vocab;
} dsv4_sampler;

int  dsv4_sampler_init(dsv4_sampler *s, const dsv4_sampling *p, int vocab, dsv4_error *err);
void dsv4_sampler_free(dsv4_sampler *s);
/* Draw the next token from one row of logits. */
int32_t dsv4_sample(dsv4_sampler *s, const float *logits);
/* The normalized distribution the sampler draws from (after temperature and filters), into out[vocab].
 * Greedy gives a one-hot row. Used by speculative verification and tests. */
void dsv4_sampler_distribution(dsv4_sampler *s, const float *logits, float *out);
#endif
