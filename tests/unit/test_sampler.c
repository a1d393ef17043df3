/* The sampler (core/sample.h): its arithmetic against independent references (libm, splitmix64's published
 * outputs, hash values computed by a separate Python implementation of the definition), the filters and tie
 * rules on hand-computed cases, the draws' frequencies against the distribution (chi-square over many draw
 * numbers, fixed seeds: deterministic), independence of consecutive draws, the counter semantics, and drawing
 * inside dsv4_step (the CPU backend; tests/gpu/test_gpu_sample.c checks the CUDA kernel against this). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/sample.h"
#include "core/sample_math.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "helpers/testmodel.h"

/* ---- arithmetic ------------------------------------------------------------------------------------------- */

static void noise_hash_matches_references(void **state) {
    (void)state;
    /* splitmix64 from state 1234567: its published first outputs */
    const uint64_t want[3] = { 6457827717110365317ULL, 3203168211198807973ULL, 9817491932198370423ULL };
    for (int i = 0; i < 3; i++) assert_true(sm_mix64(1234567ULL + (uint64_t)(i + 1) * SM_GOLDEN) == want[i]);
    /* draw keys and token bits, from a Python implementation of sample_math.h's definition */
    const struct { uint64_t seed, draw, key, bits[3]; } v[] = {
        { 42, 0, 0x4292bb992558e69eULL, { 0x5c73be3efc43a1abULL, 0xa49647223cbb6282ULL, 0x201bf07790b1400dULL } },
        { 42, 1, 0x05ef51c4fda29145ULL, { 0xf772292dcd904a4fULL, 0x3721034835347b83ULL, 0x43ffd8e150560411ULL } },
        { 7, 123456789, 0xdb0551cd54b89818ULL, { 0x4f66f3706ea9cc03ULL, 0xb435babad3ff0844ULL, 0x9015e25dc26bc0e5ULL } },
    };
    const int32_t ids[3] = { 0, 1, 129279 };
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) {
        assert_true(sm_draw_key(v[k].seed, v[k].draw) == v[k].key);
        for (int j = 0; j < 3; j++) assert_true(sm_token_bits(v[k].key, ids[j]) == v[k].bits[j]);
    }
    /* u is open at both ends, exactly */
    assert_true(sm_uniform(0) == ldexp(1.0, -53));
    assert_true(sm_uniform(~0ULL) == 1.0 - ldexp(1.0, -53));
    assert_true(sm_exp_noise(0, 0) > 0.0);
}

static void exp_and_log_are_accurate(void **state) {
    (void)state;
    assert_true(sm_expf(0.0f) == 1.0f);
    assert_true(sm_expf(-0.0f) == 1.0f);
    assert_true(sm_expf(-80.5f) == 0.0f && sm_expf(-INFINITY) == 0.0f && sm_expf(NAN) == 0.0f);
    assert_true(sm_expf(-80.0f) > 0.0f);
    double worst = 0;
    float prev = 0.0f;
    for (int k = 0; k <= 800000; k++) {
        const float x = -80.0f + 80.0f * (float)k / 800000.0f;
        const float y = sm_expf(x);
        const double ref = exp((double)x);
        const double e = fabs(y - ref) / ref;
        if (e > worst) worst = e;
        assert_true(y <= 1.0f);
        assert_true(y >= prev);   /* monotone on this sweep */
        prev = y;
    }
    printf("  sm_expf on [-80, 0]: max relative error %.3g (float eps %.3g)\n", worst, (double)FLT_EPSILON);
    assert_true(worst < 4 * FLT_EPSILON);
    worst = 0;
    for (int k = 1; k <= 200000; k++) {
        /* u over every binade it can take, and next to 1 */
        const double u = k % 2 ? ldexp(1.0 + (k % 1000) / 1000.0, -(k % 53) - 1) : 1.0 - ldexp((double)(k % 97 + 1), -53);
        const double l = sm_log_unit(u), ref = log(u);
        const double e = fabs(l - ref) / fabs(ref);
        if (e > worst) worst = e;
    }
    printf("  sm_log_unit on (0, 1): max relative error %.3g (double eps %.3g)\n", worst, DBL_EPSILON);
    assert_true(worst < 4 * DBL_EPSILON);
}

/* ---- filters and ties ---------------------------------------------------------------------------------------- */

static dsv4_sampling params(float t, int k, float p, float minp) {
    dsv4_sampling s = { .temperature = t, .top_k = k, .top_p = p, .min_p = minp, .seed = 99 };
    return s;
}

/* The kept set of a draw (its support), checked through sample_distribution. */
static void expect_support(const dsv4_sampling *p, const float *l, int V, const int *keep, const char *what) {
    sample_scratch sc;
    assert_int_equal(sample_scratch_init(&sc, V), 0);
    float *d = malloc(sizeof(float) * (size_t)V);
    sample_distribution(p, l, &sc, d);
    double sum = 0, wsum = 0;
    for (int i = 0; i < V; i++) {
        if ((d[i] > 0) != keep[i]) fail_msg("%s: token %d %s", what, i, keep[i] ? "dropped" : "kept");
        sum += d[i];
        if (keep[i]) wsum += exp(((double)l[i] - l[0]) / p->temperature);   /* l[0] is the max in these cases */
    }
    assert_true(fabs(sum - 1.0) < 1e-6);
    for (int i = 0; i < V; i++)
        if (keep[i] && fabs(d[i] - exp(((double)l[i] - l[0]) / p->temperature) / wsum) > 1e-6)
            fail_msg("%s: p[%d] = %g, want %g", what, i, d[i], exp(((double)l[i] - l[0]) / p->temperature) / wsum);
    /* and no draw ever leaves the support */
    for (uint64_t c = 0; c < 300; c++) {
        const int32_t t = sample_row(p, c, l, &sc);
        if (t < 0 || t >= V || !keep[t]) fail_msg("%s: draw %d gave token %d outside the kept set", what, (int)c, t);
    }
    free(d);
    sample_scratch_free(&sc);
}

static void filters_on_hand_computed_cases(void **state) {
    (void)state;
    /* w = 1, 1/2, 1/2, 1/4, 1/8 at T = 1 (sum 2.375); ids 1 and 2 tie */
    const float l[5] = { 0.0f, -logf(2.0f), -logf(2.0f), -logf(4.0f), -logf(8.0f) };
    struct { dsv4_sampling p; int keep[5]; const char *what; } c[] = {
        { params(1, 0, 1, 0), { 1, 1, 1, 1, 1 }, "no filter" },
        { params(1, 1, 1, 0), { 1, 0, 0, 0, 0 }, "top-k 1" },
        { params(1, 2, 1, 0), { 1, 1, 0, 0, 0 }, "top-k 2 (the tie goes to the lower id)" },
        { params(1, 3, 1, 0), { 1, 1, 1, 0, 0 }, "top-k 3" },
        { params(1, 5, 1, 0), { 1, 1, 1, 1, 1 }, "top-k = V" },
        { params(1, 0, 1, 0.4f), { 1, 1, 1, 0, 0 }, "min-p 0.4" },
        { params(1, 0, 1, 0.6f), { 1, 0, 0, 0, 0 }, "min-p 0.6" },
        { params(1, 0, 1, 0.2f), { 1, 1, 1, 1, 0 }, "min-p 0.2" },
        { params(1, 0, 0.4f, 0), { 1, 0, 0, 0, 0 }, "top-p 0.4: 1 >= 0.95" },
        { params(1, 0, 0.5f, 0), { 1, 1, 0, 0, 0 }, "top-p 0.5: 1.5 >= 1.1875 (lower id of the tie first)" },
        { params(1, 0, 0.7f, 0), { 1, 1, 1, 0, 0 }, "top-p 0.7: 2 >= 1.6625" },
        { params(1, 0, 0.9f, 0), { 1, 1, 1, 1, 0 }, "top-p 0.9: 2.25 >= 2.1375" },
        { params(1, 0, 0.99f, 0), { 1, 1, 1, 1, 1 }, "top-p 0.99" },
        { params(1, 3, 0.9f, 0), { 1, 1, 1, 0, 0 }, "top-k 3 then top-p 0.9 of what is left: 2 >= 1.8" },
        { params(1, 4, 0.8f, 0), { 1, 1, 1, 0, 0 }, "top-k 4, top-p 0.8: 2 >= 1.8" },
        { params(1, 0, 0.95f, 0.2f), { 1, 1, 1, 1, 0 }, "min-p 0.2, top-p 0.95 of the rest: 2.25 >= 2.1375" },
        { params(1, 2, 0.5f, 0.4f), { 1, 0, 0, 0, 0 }, "all three: 1 >= 0.75" },
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) expect_support(&c[i].p, l, 5, c[i].keep, c[i].what);
    /* equal logits: rank order is id order, for top-k and top-p alike */
    const float flat[6] = { 0, 0, 0, 0, 0, 0 };
    const int k3[6] = { 1, 1, 1, 0, 0, 0 }, p2[6] = { 1, 1, 0, 0, 0, 0 };
    dsv4_sampling p = params(0.7f, 3, 1, 0);
    expect_support(&p, flat, 6, k3, "flat, top-k 3");
    p = params(0.7f, 0, 0.3f, 0);
    expect_support(&p, flat, 6, p2, "flat, top-p 0.3: 2/6 >= 0.3");
}

static void greedy_and_special_values(void **state) {
    (void)state;
    sample_scratch sc;
    assert_int_equal(sample_scratch_init(&sc, 6), 0);
    const dsv4_sampling g = params(0, 0, 1, 0);
    const float a[6] = { 0.1f, 2.0f, 2.0f, -1.0f, 0.5f, 1.9f };
    assert_int_equal(sample_row(&g, 0, a, &sc), 1);                   /* ties: the lower id */
    assert_int_equal(sample_row(&g, 12345, a, &sc), 1);               /* greedy ignores the draw number */
    const float b[6] = { NAN, 1.0f, NAN, 3.0f, -INFINITY, 3.0f };
    assert_int_equal(sample_row(&g, 0, b, &sc), 3);                   /* NaN never wins */
    const float c[6] = { NAN, -INFINITY, NAN, -INFINITY, -INFINITY, NAN };
    assert_int_equal(sample_row(&g, 0, c, &sc), 0);                   /* nothing finite: id 0 */
    dsv4_sampling t = params(1.0f, 0, 1, 0);
    assert_int_equal(sample_row(&t, 0, c, &sc), 0);
    const float d[6] = { 1.0f, INFINITY, 0.0f, INFINITY, 2.0f, 3.0f };
    for (uint64_t k = 0; k < 50; k++) assert_int_equal(sample_row(&t, k, d, &sc), 1);   /* +inf: greedy among them */
    /* n_allowed: ids from it on count as -inf, in greedy and in draws */
    dsv4_sampling ga = g;
    ga.n_allowed = 3;
    const float e[6] = { 0.0f, 1.0f, 0.5f, 9.0f, 9.0f, 9.0f };
    assert_int_equal(sample_row(&ga, 0, e, &sc), 1);
    t.n_allowed = 3;
    for (uint64_t k = 0; k < 200; k++) assert_true(sample_row(&t, k, e, &sc) < 3);
    /* a NaN logit is dropped from the draw too */
    const float f[6] = { 0.0f, NAN, 0.0f, NAN, 0.0f, NAN };
    t.n_allowed = 0;
    for (uint64_t k = 0; k < 200; k++) assert_true(sample_row(&t, k, f, &sc) % 2 == 0);
    sample_scratch_free(&sc);
    /* bad parameters are one-line errors */
    dsv4_error err;
    dsv4_sampling bad = params(1, 0, 0.0f, 0);
    assert_int_equal(sample_check(&bad, &err), DSV4_E_ARG);
    bad = params(1, 0, NAN, 0);
    assert_int_equal(sample_check(&bad, &err), DSV4_E_ARG);
    bad = params(1, -1, 1, 0);
    assert_int_equal(sample_check(&bad, &err), DSV4_E_ARG);
    bad = params(1, 0, 1, 1.0f);
    assert_int_equal(sample_check(&bad, &err), DSV4_E_ARG);
    bad = params(1, 0, 1, NAN);
    assert_int_equal(sample_check(&bad, &err), DSV4_E_ARG);
    bad = params(INFINITY, 0, 1, 0);
    assert_int_equal(sample_check(&bad, &err), DSV4_E_ARG);
    bad = params(1, 0, 1, 0);
    bad.n_allowed = -2;
    assert_int_equal(sample_check(&bad, &err), DSV4_E_ARG);
}

/* ---- distribution of the draws ---------------------------------------------------------------------------------- */

/* Pearson's chi-square of counts[V] against p[V] over the tokens with p > 0; fails on a token drawn with p = 0. */
static double chi_square(const int *counts, const float *p, int V, int N, int *df) {
    double x2 = 0;
    *df = -1;
    for (int i = 0; i < V; i++) {
        if (p[i] <= 0) {
            if (counts[i]) fail_msg("token %d drawn %d times with probability 0", i, counts[i]);
            continue;
        }
        const double e = (double)N * p[i];
        x2 += (counts[i] - e) * (counts[i] - e) / e;
        (*df)++;
    }
    return x2;
}

/* 40000 draws (draw numbers 0..N-1) per case on 8 tokens. The bound 32 is the chi-square 0.9999 quantile for 7
 * degrees of freedom (fewer degrees make it looser); the seeds are fixed, so the outcome is too. */
static void draws_follow_the_distribution(void **state) {
    (void)state;
    enum { V = 8, N = 40000 };
    const float l[V] = { 1.3f, -0.2f, 0.9f, 2.1f, -3.0f, 0.9f, 1.7f, -1.1f };
    const dsv4_sampling cases[] = {
        params(1.0f, 0, 1, 0), params(0.6f, 0, 1, 0), params(2.5f, 0, 1, 0), params(1.0f, 4, 1, 0),
        params(1.0f, 0, 0.8f, 0), params(1.3f, 0, 1, 0.15f), params(0.8f, 5, 0.9f, 0.05f),
    };
    sample_scratch sc;
    assert_int_equal(sample_scratch_init(&sc, V), 0);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dsv4_sampling p = cases[k];
        p.seed = 1000 + k;
        float d[V];
        int counts[V] = { 0 }, df;
        sample_distribution(&p, l, &sc, d);
        for (int c = 0; c < N; c++) counts[sample_row(&p, (uint64_t)c, l, &sc)]++;
        const double x2 = chi_square(counts, d, V, N, &df);
        printf("  case %zu (T %.1f, top-k %d, top-p %.2f, min-p %.2f): chi-square %.2f over %d degrees of freedom\n", k,
               (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p, x2, df);
        if (x2 > 32.0) fail_msg("case %zu: chi-square %.2f: the draws do not follow the distribution", k, x2);
    }
    sample_scratch_free(&sc);
}

/* A large vocabulary with a long tail: the tail's total mass must come out right (a coarse noise grid would
 * starve it), and the top tokens' frequencies too. */
static void long_tail_mass(void **state) {
    (void)state;
    enum { V = 4000, N = 8000 };
    float *l = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) l[i] = i < 4 ? 4.0f - (float)i : -4.0f - (float)(i % 7) * 0.5f;
    dsv4_sampling p = params(1.0f, 0, 1, 0);
    p.seed = 5;
    sample_scratch sc;
    assert_int_equal(sample_scratch_init(&sc, V), 0);
    float *d = malloc(sizeof(float) * V);
    sample_distribution(&p, l, &sc, d);
    float g[5] = { d[0], d[1], d[2], d[3], 0 };
    for (int i = 4; i < V; i++) g[4] += d[i];
    int counts[5] = { 0 };
    for (int c = 0; c < N; c++) {
        const int32_t t = sample_row(&p, (uint64_t)c, l, &sc);
        counts[t < 4 ? t : 4]++;
    }
    int df;
    const double x2 = chi_square(counts, g, 5, N, &df);
    printf("  4000-token vocabulary, tail mass %.4f drawn %.4f: chi-square %.2f over %d degrees of freedom\n", (double)g[4],
           counts[4] / (double)N, x2, df);
    assert_true(x2 < 24.0);   /* 0.9999 quantile for 4 degrees */
    free(d);
    free(l);
    sample_scratch_free(&sc);
}

/* Consecutive draw numbers are independent: the joint counts of (draw 2c, draw 2c+1) against p x p. */
static void consecutive_draws_are_independent(void **state) {
    (void)state;
    enum { V = 4, N = 40000 };
    const float l[V] = { 0.5f, 0.0f, -0.4f, 0.2f };
    dsv4_sampling p = params(1.0f, 0, 1, 0);
    p.seed = 77;
    sample_scratch sc;
    assert_int_equal(sample_scratch_init(&sc, V), 0);
    float d[V], pp[V * V];
    sample_distribution(&p, l, &sc, d);
    for (int a = 0; a < V; a++)
        for (int b = 0; b < V; b++) pp[a * V + b] = d[a] * d[b];
    int counts[V * V] = { 0 }, df;
    for (int c = 0; c < N; c++) counts[sample_row(&p, 2 * (uint64_t)c, l, &sc) * V + sample_row(&p, 2 * (uint64_t)c + 1, l, &sc)]++;
    const double x2 = chi_square(counts, pp, V * V, N, &df);
    printf("  pairs of consecutive draws: chi-square %.2f over %d degrees of freedom\n", x2, df);
    assert_true(x2 < 44.3);   /* 0.9999 quantile for 15 degrees */
    /* and different seeds are different streams */
    dsv4_sampling q = p;
    q.seed = 78;
    int same = 0;
    for (uint64_t c = 0; c < 400; c++) same += sample_row(&p, c, l, &sc) == sample_row(&q, c, l, &sc);
    assert_true(same < 200);   /* sum of p^2 = about 0.27: about 108 agreements expected */
    sample_scratch_free(&sc);
}

/* The sampler's whole state is its counter: draw n is sample_row(.., n, ..), whatever came before. */
static void counter_semantics(void **state) {
    (void)state;
    enum { V = 50 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = sinf((float)i) * 2.0f;
    dsv4_sampling p = params(0.9f, 20, 0.95f, 0.01f);
    p.seed = 31337;
    dsv4_sampler a, b;
    assert_int_equal(dsv4_sampler_init(&a, &p, V, NULL), 0);
    assert_int_equal(dsv4_sampler_init(&b, &p, V, NULL), 0);
    int32_t seq[100];
    for (int c = 0; c < 100; c++) seq[c] = dsv4_sample(&a, l);
    assert_true(a.counter == 100);
    sample_scratch sc;
    assert_int_equal(sample_scratch_init(&sc, V), 0);
    for (int c = 0; c < 100; c++) assert_int_equal(seq[c], sample_row(&p, (uint64_t)c, l, &sc));
    b.counter = 60;   /* a restored counter continues the stream */
    for (int c = 60; c < 100; c++) assert_int_equal(dsv4_sample(&b, l), seq[c]);
    int distinct = 0;
    for (int c = 1; c < 100; c++) distinct += seq[c] != seq[0];
    assert_true(distinct > 0);
    sample_scratch_free(&sc);
    dsv4_sampler_free(&a);
    dsv4_sampler_free(&b);
}

/* ---- drawing inside dsv4_step (CPU backend) --------------------------------------------------------------------- */

static void step_draws_the_samplers_token(void **state) {
    (void)state;
    char dir[256];
    dsv4_model *m = tm_make("flash-tiny", NULL, 0, 3, DSV4_MODE_EXACT, dir);
    assert_non_null(m);
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    const int V = info.vocab_size;
    enum { S = 5, P = 9 };
    const dsv4_sampling sp[S] = { params(0, 0, 1, 0), params(1.0f, 0, 1, 0), params(0.7f, 10, 0.9f, 0),
                                  params(1.2f, 0, 1, 0.05f), params(0.9f, 3, 0.5f, 0.1f) };
    int32_t prompt[S][P];
    for (int i = 0; i < S; i++) tm_tokens(prompt[i], P, V, 40 + (uint64_t)i);
    float *ref = malloc(sizeof(float) * (size_t)V), *all = malloc(sizeof(float) * (size_t)V * P * S);
    sample_scratch sc;
    assert_int_equal(sample_scratch_init(&sc, V), 0);
    dsv4_error err;
    dsv4_seq *seq[S];
    dsv4_step_item it[S];
    int32_t got[S];
    for (int i = 0; i < S; i++) assert_int_equal(dsv4_seq_new(m, &seq[i], &err), 0);
    /* one batched step: items wanting no logits, the last row, every row */
    for (int i = 0; i < S; i++) {
        const dsv4_logits_want w = i % 3 == 0 ? DSV4_LOGITS_NONE : i % 3 == 1 ? DSV4_LOGITS_LAST : DSV4_LOGITS_ALL;
        it[i] = (dsv4_step_item){ seq[i], prompt[i], P, w, w == DSV4_LOGITS_NONE ? NULL : all + (int64_t)i * P * V };
        it[i].sample = &sp[i];
        it[i].draw = 17 + (uint64_t)i;
        it[i].token = &got[i];
    }
    assert_int_equal(dsv4_step(m, it, S, &err), 0);
    for (int i = 0; i < S; i++) {
        /* the same prompt alone, last row to the host, drawn by the sampler */
        dsv4_seq *q;
        assert_int_equal(dsv4_seq_new(m, &q, &err), 0);
        dsv4_step_item one = { q, prompt[i], P, DSV4_LOGITS_LAST, ref };
        assert_int_equal(dsv4_step(m, &one, 1, &err), 0);
        assert_int_equal(got[i], sample_row(&sp[i], 17 + (uint64_t)i, ref, &sc));
        if (it[i].want == DSV4_LOGITS_LAST) assert_memory_equal(all + (int64_t)i * P * V, ref, sizeof(float) * (size_t)V);
        if (it[i].want == DSV4_LOGITS_ALL) assert_memory_equal(all + ((int64_t)i * P + P - 1) * V, ref, sizeof(float) * (size_t)V);
        dsv4_seq_free(q);
    }
    /* a bad request changes nothing */
    const int64_t pos0 = dsv4_seq_position(seq[0]);
    dsv4_sampling bad = params(1, 0, 0, 0);
    dsv4_step_item b1 = { seq[0], prompt[0], 1, DSV4_LOGITS_NONE, NULL };
    b1.sample = &bad;
    b1.token = &got[0];
    assert_int_equal(dsv4_step(m, &b1, 1, &err), DSV4_E_ARG);
    assert_non_null(strstr(err.msg, "top-p"));
    b1.sample = &sp[1];
    b1.token = NULL;
    assert_int_equal(dsv4_step(m, &b1, 1, &err), DSV4_E_ARG);
    assert_int_equal(dsv4_seq_position(seq[0]), pos0);
    for (int i = 0; i < S; i++) dsv4_seq_free(seq[i]);
    sample_scratch_free(&sc);
    free(ref);
    free(all);
    dsv4_model_free(m);
    tm_rmdir(dir);
}

/* The scheduler draws inside the step when nothing needs the rows; a no-op logits hook forces host sampling of
 * the returned rows: both give the same tokens, stream by stream. */
typedef struct {
    int calls, nulls;
} obs_count;
static void count_tokens(void *ctx, int64_t id, int index, int32_t token, const float *logits) {
    obs_count *o = ctx;
    o->calls++;
    o->nulls += logits == NULL;
}
static int no_op_hook(void *ctx, const int32_t *g, int n, float *logits, int vocab) { return 0; }

static void run_streams(dsv4_model *m, int hooked, int observe, int32_t out[6][12], int n_out[6]) {
    dsv4_error err;
    dsv4_sched *s;
    dsv4_sched_opts o = { 3, 7 };
    assert_int_equal(dsv4_sched_new(m, &o, &s, &err), 0);
    obs_count oc = { 0, 0 };
    if (observe) {
        dsv4_sched_set_observer(s, count_tokens, &oc);
        dsv4_sched_observer_needs_logits(s, 0);
    }
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int64_t id[6];
    int32_t prompt[6][20];
    for (int i = 0; i < 6; i++) {
        tm_tokens(prompt[i], 5 + 3 * i, info.vocab_size, 300 + (uint64_t)i);
        dsv4_request r = { prompt[i], 5 + 3 * i, params(0.6f + 0.2f * (float)(i % 3), i % 2 ? 8 : 0, i % 3 ? 0.9f : 1.0f, 0), 12, 0 };
        r.sampling.seed = 900 + (uint64_t)i;
        if (hooked) r.hook = (dsv4_logits_hook){ no_op_hook, NULL };
        assert_int_equal(dsv4_sched_add(s, &r, &id[i], &err), 0);
    }
    while (dsv4_sched_pending(s) > 0) assert_int_equal(dsv4_sched_step(s, &err), 0);
    for (int i = 0; i < 6; i++) {
        dsv4_req_result r;
        assert_int_equal(dsv4_sched_result(s, id[i], &r, &err), 0);
        n_out[i] = r.n_tokens;
        memcpy(out[i], r.tokens, sizeof(int32_t) * (size_t)r.n_tokens);
    }
    if (observe) assert_true(oc.calls == 72 && oc.nulls == (hooked ? 0 : 72));
    dsv4_sched_free(s);
}

static void scheduler_draws_in_the_step(void **state) {
    (void)state;
    char dir[256];
    dsv4_model *m = tm_make("flash-tiny", NULL, 0, 4, DSV4_MODE_EXACT, dir);
    assert_non_null(m);
    int32_t a[6][12], b[6][12];
    int na[6], nb[6];
    run_streams(m, 0, 1, a, na);
    run_streams(m, 1, 1, b, nb);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(na[i], 12);
        assert_int_equal(nb[i], 12);
        assert_memory_equal(a[i], b[i], sizeof(int32_t) * 12);
    }
    dsv4_model_free(m);
    tm_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(noise_hash_matches_references),
        cmocka_unit_test(exp_and_log_are_accurate),
        cmocka_unit_test(filters_on_hand_computed_cases),
        cmocka_unit_test(greedy_and_special_values),
        cmocka_unit_test(draws_follow_the_distribution),
        cmocka_unit_test(long_tail_mass),
        cmocka_unit_test(consecutive_draws_are_independent),
        cmocka_unit_test(counter_semantics),
        cmocka_unit_test(step_draws_the_samplers_token),
        cmocka_unit_test(scheduler_draws_in_the_step),
    };
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
