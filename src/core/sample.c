/* The CPU implementation of a draw (sample.h has the definition). The kernel in backend/cuda/k_sample.cu is the
 * same algorithm over a block of SM_LANES threads; this file keeps only the kept tokens in a list (id order), which
 * gives the same sums because the tokens it leaves out would add +0.0. Built with -ffp-contract=off (Makefile). */
#include "core/sample.h"
#include "core/sample_math.h"
#include "util/error.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int sample_check(const dsv4_sampling *p, dsv4_error *err) {
    if (!p) return dsv4_fail(err, DSV4_E_ARG, "no sampling parameters");
    if (!isfinite(p->temperature)) return dsv4_fail(err, DSV4_E_ARG, "temperature must be finite");
    if (p->top_k < 0) return dsv4_fail(err, DSV4_E_ARG, "top-k must be >= 0");
    if (!(p->top_p > 0.0f)) return dsv4_fail(err, DSV4_E_ARG, "top-p must be > 0");
    if (!(p->min_p < 1.0f)) return dsv4_fail(err, DSV4_E_ARG, "min-p must be < 1");
    if (p->n_allowed < 0) return dsv4_fail(err, DSV4_E_ARG, "the number of allowed ids must be >= 0 (0 = all)");
    return 0;
}

int sample_scratch_init(sample_scratch *sc, int vocab) {
    memset(sc, 0, sizeof *sc);
    if (vocab <= 0) return -1;
    sc->vocab = vocab;
    sc->w = malloc(sizeof(float) * (size_t)vocab);
    sc->ids = malloc(sizeof(int32_t) * (size_t)vocab);
    sc->lanes = malloc(sizeof(double) * SM_LANES);
    if (!sc->w || !sc->ids || !sc->lanes) {
        sample_scratch_free(sc);
        return -1;
    }
    return 0;
}

void sample_scratch_free(sample_scratch *sc) {
    free(sc->w);
    free(sc->ids);
    free(sc->lanes);
    memset(sc, 0, sizeof *sc);
}

/* argmax v_i, lowest id on ties; *best = the max. */
static int32_t greedy(const float *logits, int V, int32_t limit, float *best) {
    double bv = -INFINITY;
    int32_t bi = INT32_MAX;
    for (int32_t i = 0; i < V; i++) {
        const float v = sm_logit(logits[i], i, limit);
        if (sm_before(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    *best = (float)bv;
    return bi;
}

/* A kept token (bits of w not 0) at or above the cut (cb, cj): bits > cb, or bits == cb and id <= cj. The list
 * holds only kept tokens; the kernel's row also has the dropped ones, as 0. */
static int in_cut(uint32_t b, int32_t id, uint32_t cb, int32_t cj) { return b != 0 && (b > cb || (b == cb && id <= cj)); }

/* The measure of the first n kept tokens that are in the cut: their count, or their treesum (sample.h). */
static double measure(const sample_scratch *sc, int n, uint32_t cb, int32_t cj, int sum) {
    if (!sum) {
        int64_t c = 0;
        for (int k = 0; k < n; k++) c += in_cut(sm_f2u(sc->w[k]), sc->ids[k], cb, cj);
        return (double)c;
    }
    double *L = sc->lanes;
    for (int j = 0; j < SM_LANES; j++) L[j] = 0.0;
    for (int k = 0; k < n; k++)
        if (in_cut(sm_f2u(sc->w[k]), sc->ids[k], cb, cj)) {
            const int j = sc->ids[k] % SM_LANES;
            L[j] = SM_DADD(L[j], (double)sc->w[k]);
        }
    for (int s = SM_LANES / 2; s > 0; s >>= 1)
        for (int j = 0; j < s; j++) L[j] = SM_DADD(L[j], L[j + s]);
    return L[0];
}

/* Keep the shortest rank-order prefix whose measure reaches goal (it exists: the whole list does): the largest
 * bits cb with measure(bits >= cb) >= goal, then the smallest id cj in that class with measure(cut) >= goal.
 * The same two binary searches as the kernel. Returns the new length of the list. */
static int keep_prefix(sample_scratch *sc, int n, double goal, int sum) {
    uint32_t lo = 1, hi = SM_ONE_BITS;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        if (measure(sc, n, mid, INT32_MAX, sum) >= goal) lo = mid;
        else hi = mid - 1;
    }
    const uint32_t cb = lo;
    int32_t jlo = 0, jhi = sc->vocab - 1;
    while (jlo < jhi) {
        const int32_t mid = jlo + (jhi - jlo) / 2;
        if (measure(sc, n, cb, mid, sum) >= goal) jhi = mid;
        else jlo = mid + 1;
    }
    int m = 0;
    for (int k = 0; k < n; k++)
        if (in_cut(sm_f2u(sc->w[k]), sc->ids[k], cb, jlo)) {
            sc->w[m] = sc->w[k];
            sc->ids[m] = sc->ids[k];
            m++;
        }
    return m;
}

/* Steps 1-6 of sample.h: the kept set in sc (returns its size), or 0 with *token set when the draw is greedy. */
static int kept_set(const dsv4_sampling *p, const float *logits, sample_scratch *sc, int32_t *token) {
    const int V = sc->vocab;
    float m;
    *token = greedy(logits, V, p->n_allowed, &m);
    if (!(p->temperature > 0.0f) || !isfinite(m)) return 0;
    const float inv_t = SM_FDIVF(1.0f, fmaxf(p->temperature, 1e-5f));
    int n = 0;
    for (int32_t i = 0; i < V; i++) {
        const float w = sm_expf(SM_FMULF(SM_FSUBF(sm_logit(logits[i], i, p->n_allowed), m), inv_t));
        if (w > 0.0f && w >= p->min_p) {
            sc->w[n] = w;
            sc->ids[n] = i;
            n++;
        }
    }
    if (p->top_k > 0 && p->top_k < n) n = keep_prefix(sc, n, (double)p->top_k, 0);
    if (p->top_p < 1.0f) n = keep_prefix(sc, n, SM_DMUL((double)p->top_p, measure(sc, n, 0, INT32_MAX, 1)), 1);
    return n;
}

int32_t sample_row(const dsv4_sampling *p, uint64_t draw, const float *logits, sample_scratch *sc) {
    int32_t token;
    const int n = kept_set(p, logits, sc, &token);
    if (n == 0) return token;
    const uint64_t key = sm_draw_key(p->seed, draw);
    double bv = -1.0;
    int32_t bi = INT32_MAX;
    for (int k = 0; k < n; k++) {
        const double r = sm_race(sc->w[k], key, sc->ids[k]);
        if (sm_before(r, sc->ids[k], bv, bi)) {
            bv = r;
            bi = sc->ids[k];
        }
    }
    return bi;
}

void sample_distribution(const dsv4_sampling *p, const float *logits, sample_scratch *sc, float *out) {
    int32_t token;
    const int n = kept_set(p, logits, sc, &token);
    memset(out, 0, sizeof(float) * (size_t)sc->vocab);
    if (n == 0) {
        out[token] = 1.0f;
        return;
    }
    const double S = measure(sc, n, 0, INT32_MAX, 1);
    for (int k = 0; k < n; k++) out[sc->ids[k]] = (float)SM_DDIV((double)sc->w[k], S);
}
