#define _GNU_SOURCE /* qsort_r */
#include "engine/sampler.h"
#include "util/error.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* xoshiro256** seeded through splitmix64 */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t next_u64(uint64_t *s) {
    const uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return r;
}
static double uniform_open(uint64_t *s) { return ((next_u64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

int dsv4_sampler_init(dsv4_sampler *s, const dsv4_sampling *p, int vocab, dsv4_error *err) {
    memset(s, 0, sizeof *s);
    if (vocab <= 0) return dsv4_fail(err, DSV4_E_ARG, "sampler: empty vocabulary");
    if (p->top_k < 0) return dsv4_fail(err, DSV4_E_ARG, "top-k must be >= 0");
    if (!(p->top_p > 0.0f)) return dsv4_fail(err, DSV4_E_ARG, "top-p must be > 0");
    if (p->min_p >= 1.0f) return dsv4_fail(err, DSV4_E_ARG, "min-p must be < 1");
    if (!isfinite(p->temperature)) return dsv4_fail(err, DSV4_E_ARG, "temperature must be finite");
    s->params = *p;
    s->vocab = vocab;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->prob = malloc(sizeof(float) * (size_t)vocab);
    s->order = malloc(sizeof(int32_t) * (size_t)vocab);
    if (!s->prob || !s->order) { dsv4_sampler_free(s); return dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); }
    return 0;
}

void dsv4_sampler_free(dsv4_sampler *s) {
    free(s->prob);
    free(s->order);
    s->prob = NULL;
    s->order = NULL;
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

static int by_prob_desc(const void *a, const void *b, void *ctx) {
    const float *sort_key = ctx;
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (sort_key[i] != sort_key[j]) return sort_key[i] > sort_key[j] ? -1 : 1;
    return (i > j) - (i < j);
}

void dsv4_sampler_distribution(dsv4_sampler *s, const float *logits, float *out) {
    const int V = s->vocab;
    const dsv4_sampling *p = &s->params;
    if (p->temperature <= 0.0f) {
        memset(out, 0, sizeof(float) * (size_t)V);
        out[argmax(logits, V)] = 1.0f;
        return;
    }
    /* softmax(logits / T) in double for the normaliser, stored as float */
    const float inv_t = 1.0f / fmaxf(p->temperature, 1e-5f);
    float mx = logits[0] * inv_t;
    for (int i = 1; i < V; i++) mx = fmaxf(mx, logits[i] * inv_t);
    double sum = 0;
    for (int i = 0; i < V; i++) { out[i] = expf(logits[i] * inv_t - mx); sum += out[i]; }
    for (int i = 0; i < V; i++) out[i] = (float)(out[i] / sum);
    const int need_sort = (p->top_k > 0 && p->top_k < V) || p->top_p < 1.0f;
    if (p->min_p > 0.0f) {
        float pmax = 0;
        for (int i = 0; i < V; i++) pmax = fmaxf(pmax, out[i]);
        for (int i = 0; i < V; i++) if (out[i] < p->min_p * pmax) out[i] = 0.0f;
    }
    if (need_sort) {
        for (int i = 0; i < V; i++) s->order[i] = i;
        qsort_r(s->order, (size_t)V, sizeof(int32_t), by_prob_desc, out);
        int keep = V;
        if (p->top_k > 0 && p->top_k < keep) keep = p->top_k;
        if (p->top_p < 1.0f) {
            double c = 0;
            for (int r = 0; r < keep; r++) {
                c += out[s->order[r]];
                if (c >= p->top_p) { keep = r + 1; break; }
            }
        }
        for (int r = keep; r < V; r++) out[s->order[r]] = 0.0f;
    }
    sum = 0;
    for (int i = 0; i < V; i++) sum += out[i];
    for (int i = 0; i < V; i++) out[i] = (float)(out[i] / sum);
}

int32_t dsv4_sample(dsv4_sampler *s, const float *logits) {
    if (s->params.temperature <= 0.0f) return argmax(logits, s->vocab);
    dsv4_sampler_distribution(s, logits, s->prob);
    /* exponential race: argmax p_i / E_i with E_i ~ Exp(1) picks i with probability p_i */
    int32_t best = -1;
    double bv = -1;
    for (int i = 0; i < s->vocab; i++) {
        const double e = -log(uniform_open(s->rng));
        if (s->prob[i] <= 0.0f) continue;
        const double v = s->prob[i] / e;
        if (v > bv) { bv = v; best = i; }
    }
    return best < 0 ? argmax(logits, s->vocab) : best;
}
