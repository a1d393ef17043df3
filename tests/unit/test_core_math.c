/* Unit tests of the layer math against hand computation: RoPE/YaRN frequencies (spec §4.1), Sinkhorn (§6.2),
 * sink softmax (§7.4), compressor pooling and its overlap (§8.2, §8.4), sampler basics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include "core/attention.h"
#include "core/compressor.h"
#include "core/hc.h"
#include "engine/sampler.h"
#include "model/config.h"
#include "model/model.h"

static dsv4_config flash_rope_config(void) {
    dsv4_config c;
    memset(&c, 0, sizeof c);
    c.rope_dim = 64;
    c.rope_factor = 16.0f;
    c.original_seq_len = 65536;
    c.beta_fast = 32.0f;
    c.beta_slow = 1.0f;
    return c;
}

/* Compressed regime: base 160000 with YaRN. Raw bounds 15.45 and 24.71 -> lo = 15, hi = 25: pairs 0..15 keep
 * their frequency, pairs >= 25 are divided by 16, pair 20 sits half way (ramp (20-15)/10 = 0.5). */
static void yarn_compressed_regime(void **st) {
    dsv4_config c = flash_rope_config();
    dsv4_rope r;
    assert_int_equal(dsv4_rope_init(&r, &c, 160000.0f, 1, NULL), 0);
    for (int i = 0; i < 32; i++) {
        double f = pow(160000.0, -(2.0 * i) / 64.0), want;
        if (i <= 15) want = f;
        else if (i >= 25) want = f / 16.0;
        else { double ramp = (i - 15) / 10.0; want = f / 16.0 * ramp + f * (1.0 - ramp); }
        if (fabs(r.freq[i] - want) > 2e-6 * want) fail_msg("pair %d: %.9g, expected %.9g", i, r.freq[i], want);
    }
    assert_true(fabs(r.freq[20] - 0.5 * (1.0 + 1.0 / 16.0) * pow(160000.0, -40.0 / 64.0)) < 1e-6 * r.freq[20]);
    free(r.freq);
}

/* Window layers: base 10000, no YaRN at all. */
static void rope_window_regime(void **st) {
    dsv4_config c = flash_rope_config();
    dsv4_rope r;
    assert_int_equal(dsv4_rope_init(&r, &c, 10000.0f, 0, NULL), 0);
    assert_true(r.freq[0] == 1.0f);
    for (int i = 0; i < 32; i++) {
        double want = pow(10000.0, -(2.0 * i) / 64.0);
        assert_true(fabs(r.freq[i] - want) <= 2e-7 * want);
    }
    free(r.freq);
}

/* Sinkhorn on a 2x2 by hand: logits [[ln 3, 0], [0, 0]]. Row softmax (eps 0 here): [[.75, .25], [.5, .5]];
 * one column normalisation gives [[.6, 1/3], [.4, 2/3]]. Then the full 20-iteration run on a 4x4 must be
 * (nearly) doubly stochastic, columns exactly so since they are normalised last. */
static void sinkhorn_by_hand(void **st) {
    float C[4] = {logf(3.0f), 0.0f, 0.0f, 0.0f};
    hc_sinkhorn(C, 2, 1, 0.0f);   /* softmax rows, then one column normalisation */
    /* columns: col0 = [.75, .5] / 1.25 = [.6, .4]; col1 = [.25, .5] / .75 = [1/3, 2/3] */
    assert_true(fabs(C[0] - 0.6f) < 1e-6 && fabs(C[2] - 0.4f) < 1e-6);
    assert_true(fabs(C[1] - 1.0f / 3) < 1e-6 && fabs(C[3] - 2.0f / 3) < 1e-6);
    float D[16];
    for (int i = 0; i < 16; i++) D[i] = (float)((i * 7) % 5) - 2.0f + 0.1f * (float)i;
    hc_sinkhorn(D, 4, 20, 1e-6f);
    for (int j = 0; j < 4; j++) {
        float rs = 0, cs = 0;
        for (int k = 0; k < 4; k++) { rs += D[j * 4 + k]; cs += D[k * 4 + j]; }
        assert_true(fabs(cs - 1.0f) < 1e-5);   /* the last step normalised columns */
        assert_true(fabs(rs - 1.0f) < 1e-3);   /* rows converge */
    }
}

/* Sink softmax with two keys, by hand: scores s1 = q.k1 * scale, s2 = q.k2 * scale; weights
 * e^s_i / (e^s1 + e^s2 + e^sink); the sink adds to the denominator only. */
static void sink_softmax_by_hand(void **st) {
    const float k1[4] = {1, 0, 0, 0}, k2[4] = {0, 2, 0, 0}, q[4] = {1, 1, 0, 0};
    const float *keys[2] = {k1, k2};
    float sc[2], out[4];
    const float scale = 0.5f, sink = 0.25f;
    sink_attention(DSV4_MODE_EXACT, q, keys, 2, 4, scale, sink, sc, out);
    double e1 = exp(0.5), e2 = exp(1.0), es = exp(0.25), den = e1 + e2 + es;
    assert_true(fabs(out[0] - e1 / den) < 1e-6);
    assert_true(fabs(out[1] - 2 * e2 / den) < 1e-6);
    assert_true(out[2] == 0.0f && out[3] == 0.0f);
    /* a very negative sink vanishes: plain softmax */
    sink_attention(DSV4_MODE_EXACT, q, keys, 2, 4, scale, -1e30f, sc, out);
    assert_true(fabs(out[0] - e1 / (e1 + e2)) < 1e-6);
}

/* Ratio-4 compressor with width 1 (so coff*c = 2 columns: A half, B half). Chunk 0 pools only its B slots;
 * chunk 1 pools the A half of chunk 0 and the B half of chunk 1. Hand formula: softmax over slot scores. */
static void compressor_overlap_by_hand(void **st) {
    dsv4_compressor_state s;
    assert_int_equal(compressor_state_init(&s, &seq_mem_host, 4, 1, 0), 0);
    float K[8][2], Z[8][2], pooled[1];
    for (int t = 0; t < 8; t++) {
        K[t][0] = 10.0f + t;  K[t][1] = 100.0f + t;   /* A value, B value */
        Z[t][0] = 0.1f * t;   Z[t][1] = -0.2f * t;    /* A score, B score */
    }
    for (int t = 0; t < 4; t++) {
        int emitted = compressor_push(&s, K[t], Z[t], t, pooled);
        assert_int_equal(emitted, t == 3);
    }
    double num = 0, den = 0;
    for (int t = 0; t < 4; t++) { double e = exp(Z[t][1]); num += e * K[t][1]; den += e; }
    assert_true(fabs(pooled[0] - num / den) < 1e-4);
    for (int t = 4; t < 8; t++) assert_int_equal(compressor_push(&s, K[t], Z[t], t, pooled), t == 7);
    num = den = 0;
    for (int t = 0; t < 4; t++) { double e = exp(Z[t][0]); num += e * K[t][0]; den += e; }   /* A of chunk 0 */
    for (int t = 4; t < 8; t++) { double e = exp(Z[t][1]); num += e * K[t][1]; den += e; }   /* B of chunk 1 */
    assert_true(fabs(pooled[0] - num / den) < 1e-4);
    compressor_state_free(&s);
}

/* Ratio-128: no overlap, one row per 128 positions, pooled over exactly that chunk. */
static void compressor_ratio128_by_hand(void **st) {
    dsv4_compressor_state s;
    assert_int_equal(compressor_state_init(&s, &seq_mem_host, 128, 1, 0), 0);
    float pooled[1];
    double num = 0, den = 0;
    for (int t = 128; t < 256; t++) {   /* start mid-stream: slots are pos mod 128 */
        float K = (float)(t % 13), Z = 0.01f * (float)(t % 7);
        assert_int_equal(compressor_push(&s, &K, &Z, t, pooled), t == 255);
        double e = exp(Z);
        num += e * K;
        den += e;
    }
    assert_true(fabs(pooled[0] - num / den) < 1e-4);
    compressor_state_free(&s);
}

static void sampler_basics(void **st) {
    float logits[6] = {0.1f, 2.0f, 2.0f, -1.0f, 0.5f, 1.9f};
    dsv4_sampling p = { .temperature = 0.0f, .top_p = 1.0f };
    dsv4_sampler s;
    assert_int_equal(dsv4_sampler_init(&s, &p, 6, NULL), 0);
    assert_int_equal(dsv4_sample(&s, logits), 1);        /* ties go to the lower id */
    dsv4_sampler_free(&s);
    p.temperature = 1.0f;
    p.top_k = 1;
    assert_int_equal(dsv4_sampler_init(&s, &p, 6, NULL), 0);
    for (int i = 0; i < 20; i++) assert_int_equal(dsv4_sample(&s, logits), 1);
    dsv4_sampler_free(&s);
    /* top-p 0.5 over softmax(logits): the two 2.0 logits hold 2e^2 / sum; the third-largest (1.9) is cut */
    p.top_k = 0;
    p.top_p = 0.5f;
    float dist[6];
    assert_int_equal(dsv4_sampler_init(&s, &p, 6, NULL), 0);
    dsv4_sampler_distribution(&s, logits, dist);
    assert_true(dist[0] == 0 && dist[3] == 0 && dist[4] == 0 && dist[5] == 0);
    assert_true(fabs(dist[1] - 0.5f) < 1e-6 && fabs(dist[2] - 0.5f) < 1e-6);
    dsv4_sampler_free(&s);
    /* same seed, same draws; the empirical frequencies follow softmax */
    p.top_p = 1.0f;
    p.seed = 42;
    int counts[6] = {0};
    assert_int_equal(dsv4_sampler_init(&s, &p, 6, NULL), 0);
    for (int i = 0; i < 20000; i++) counts[dsv4_sample(&s, logits)]++;
    dsv4_sampler_distribution(&s, logits, dist);
    for (int v = 0; v < 6; v++) assert_true(fabs(counts[v] / 20000.0 - dist[v]) < 0.015);
    dsv4_sampler_free(&s);
    /* bad parameters are errors, not crashes */
    p.top_p = 0.0f;
    dsv4_error err;
    assert_int_not_equal(dsv4_sampler_init(&s, &p, 6, &err), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(yarn_compressed_regime),
        cmocka_unit_test(rope_window_regime),
        cmocka_unit_test(sinkhorn_by_hand),
        cmocka_unit_test(sink_softmax_by_hand),
        cmocka_unit_test(compressor_overlap_by_hand),
        cmocka_unit_test(compressor_ratio128_by_hand),
        cmocka_unit_test(sampler_basics),
    };
    return cmocka_run_group_tests_name("core math", tests, NULL, NULL);
}
