/* The parity matrix (spec §15.3, DESIGN §6.2): in EXACT mode (and in OFFICIAL mode too) the logits at every position are bit-identical
 * (memcmp) whether the tokens go in one call, one at a time after a prefill of any length, or in random
 * chunks — for every layer topology, across compressor chunk boundaries (s mod 4, s = 127/128/129), window
 * wrap, and index_topk both below and above the number of ratio-4 rows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "helpers/testmodel.h"
#include "model/tiny.h"

#define SEQ_LEN 300

typedef struct {
    const char *name;
    const char *preset;
    const char *sets[6];
    int n_sets;
    dsv4_mode mode;
} topology;

static const topology topologies[] = {
    {"flash-like", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3},
    {"pro-like", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3},
    {"all-window", "flash-tiny", {"compress_ratios=[0,0,0,0]", "num_hidden_layers=4", "sliding_window=8"}, 3},
    {"compressed-only", "flash-tiny", {"compress_ratios=[4,128,4,128]", "num_hidden_layers=4", "sliding_window=16", "index_topk=2"}, 4},
    /* index_topk above every row count: the indexer selects everything, scoring is irrelevant */
    {"flash-topk-large", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=128"}, 3},
    /* OFFICIAL mode rounds at the official points, per token, with the same kernels on every path: it is as
     * exact across paths as EXACT mode, so it gets the same memcmp matrix (a stronger claim than a tolerance) */
    {"official flash-like", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3,
     DSV4_MODE_OFFICIAL},
    {"official pro-like", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3,
     DSV4_MODE_OFFICIAL},
};

typedef struct {
    dsv4_model *m;
    char dir[256];
    int vocab;
    int32_t tok[SEQ_LEN];
    float *ref;          /* one-shot logits of the whole sequence */
} fixture;

static int setup(void **state, const topology *tp) {
    fixture *f = calloc(1, sizeof *f);
    f->m = tm_make(tp->preset, tp->sets, tp->n_sets, 1234, tp->mode, f->dir);
    if (!f->m) return -1;
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    tm_tokens(f->tok, SEQ_LEN, f->vocab, 99);
    f->ref = tm_logits(f->m, f->tok, SEQ_LEN, NULL, 0);
    if (!f->ref) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    free(f->ref);
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

static size_t row_bytes(const fixture *f, int n) { return sizeof(float) * (size_t)n * (size_t)f->vocab; }

/* A one-shot prefix of length s gives the same logits as the first s rows of the full one-shot run. */
static void check_one_shot_lengths(fixture *f) {
    static const int lengths[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 127, 128, 129, 131};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        float *l = tm_logits(f->m, f->tok, lengths[i], NULL, 0);
        assert_non_null(l);
        if (memcmp(l, f->ref, row_bytes(f, lengths[i]))) fail_msg("one-shot of %d tokens differs", lengths[i]);
        free(l);
    }
}

/* Prefill k tokens in one call, then decode one token per call up to k + 12 (or the end). */
static void check_prefill_then_decode(fixture *f) {
    static const int prefixes[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 126, 127, 128, 129, 255, 256};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        int k = prefixes[i], n = k + 12 > SEQ_LEN ? SEQ_LEN : k + 12;
        int chunks[1] = {k};
        float *l = tm_logits(f->m, f->tok, n, chunks, 1);
        assert_non_null(l);
        for (int p = 0; p < n; p++)
            if (memcmp(l + (int64_t)p * f->vocab, f->ref + (int64_t)p * f->vocab, row_bytes(f, 1)))
                fail_msg("prefill %d then decode: position %d differs", k, p);
        free(l);
    }
}

/* Every token in its own call, the whole sequence. */
static void check_token_by_token(fixture *f) {
    int one[1] = {1};
    float *l = tm_logits(f->m, f->tok, SEQ_LEN, one, 1);
    assert_non_null(l);
    for (int p = 0; p < SEQ_LEN; p++)
        if (memcmp(l + (int64_t)p * f->vocab, f->ref + (int64_t)p * f->vocab, row_bytes(f, 1)))
            fail_msg("token-by-token: position %d differs", p);
    free(l);
}

/* Random chunk splits (sizes 1..70), several seeds. */
static void check_random_chunks(fixture *f) {
    dsv4_rng r;
    dsv4_rng_seed(&r, 7);
    for (int trial = 0; trial < 4; trial++) {
        int chunks[SEQ_LEN], n = 0, sum = 0;
        while (sum < SEQ_LEN) {
            int c = 1 + (int)dsv4_rng_below(&r, trial % 2 ? 9 : 70);
            chunks[n++] = c;
            sum += c;
        }
        float *l = tm_logits(f->m, f->tok, SEQ_LEN, chunks, n);
        assert_non_null(l);
        for (int p = 0; p < SEQ_LEN; p++)
            if (memcmp(l + (int64_t)p * f->vocab, f->ref + (int64_t)p * f->vocab, row_bytes(f, 1)))
                fail_msg("random chunks (trial %d): position %d differs", trial, p);
        free(l);
    }
}

/* The logits are not degenerate: positions differ and argmax varies (a test on constant logits proves nothing). */
static void check_not_degenerate(fixture *f) {
    int distinct = 0, first = -1;
    for (int p = 0; p < SEQ_LEN; p++) {
        const float *row = f->ref + (int64_t)p * f->vocab;
        int best = 0;
        for (int v = 1; v < f->vocab; v++) if (row[v] > row[best]) best = v;
        if (first < 0) first = best;
        else if (best != first) distinct = 1;
    }
    assert_true(distinct);
}

static void parity(void **state) {
    fixture *f = *state;
    check_not_degenerate(f);
    check_one_shot_lengths(f);
    check_prefill_then_decode(f);
    check_token_by_token(f);
    check_random_chunks(f);
}

#define TOPO_TEST(i) \
    static int setup_##i(void **s) { return setup(s, &topologies[i]); }
TOPO_TEST(0)
TOPO_TEST(1)
TOPO_TEST(2)
TOPO_TEST(3)
TOPO_TEST(4)
TOPO_TEST(5)
TOPO_TEST(6)

int main(void) {
    const struct CMUnitTest tests[] = {
        {"flash-like [0,0,4,128,4,128] topk 3", parity, setup_0, teardown, NULL},
        {"pro-like [128,128,4,128] topk 5", parity, setup_1, teardown, NULL},
        {"all-window [0,0,0,0]", parity, setup_2, teardown, NULL},
        {"compressed-only [4,128,4,128] topk 2", parity, setup_3, teardown, NULL},
        {"flash-like, index_topk above row count", parity, setup_4, teardown, NULL},
        {"OFFICIAL mode, flash-like", parity, setup_5, teardown, NULL},
        {"OFFICIAL mode, pro-like", parity, setup_6, teardown, NULL},
    };
    /* DSV4_QUICK (the sanitizer run): the Flash-like and Pro-like layouts only; the normal run does all. */
    if (getenv("DSV4_QUICK")) return _cmocka_run_group_tests("parity (EXACT, memcmp), quick", tests, 2, NULL, NULL);
    return cmocka_run_group_tests_name("parity (EXACT, memcmp)", tests, NULL, NULL);
}
