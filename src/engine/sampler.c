#include "engine/sampler.h"
#include "util/error.h"
#include <string.h>

int dsv4_sampler_init(dsv4_sampler *s, const dsv4_sampling *p, int vocab, dsv4_error *err) {
    memset(s, 0, sizeof *s);
    if (vocab <= 0) return dsv4_fail(err, DSV4_E_ARG, "sampler: empty vocabulary");
    int rc = sample_check(p, err);
    if (rc) return rc;
    s->params = *p;
    s->vocab = vocab;
    if (sample_scratch_init(&s->sc, vocab)) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    return 0;
}

void dsv4_sampler_free(dsv4_sampler *s) { sample_scratch_free(&s->sc); }

int32_t dsv4_sample(dsv4_sampler *s, const float *logits) { return sample_row(&s->params, s->counter++, logits, &s->sc); }

void dsv4_sampler_distribution(dsv4_sampler *s, const float *logits, float *out) {
    sample_distribution(&s->params, logits, &s->sc, out);
}
