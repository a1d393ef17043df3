/* The parity matrix on the GPU (issue 11, "what must hold" 1): on a cuda model, in both numeric modes and in
 * every KV format, the logits at every position are bit-identical (memcmp) to the one-shot run whether the
 * tokens go in one call, one at a time after a prefill, in random chunks, batched beside other streams of
 * other lengths, through a save and a restore, through a fork, or through speculative steps rolled back; and
 * the same on every run. The same topologies and lengths as tests/unit/test_parity.c. */
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
    const char *sets[8];
    int n_sets;
    dsv4_mode mode;
    int kv;
} topology;

static const topology topologies[] = {
    {"EXACT flash-like [0,0,4,128,4,128] topk 3", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_EXACT, DSV4_KV_F32},
    {"EXACT pro-like [128,128,4,128] topk 5", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3, DSV4_MODE_EXACT, DSV4_KV_F32},
    {"EXACT all-window", "flash-tiny", {"compress_ratios=[0,0,0,0]", "num_hidden_layers=4", "sliding_window=8"}, 3, DSV4_MODE_EXACT, DSV4_KV_F32},
    {"EXACT compressed-only [4,128,4,128] topk 2", "flash-tiny", {"compress_ratios=[4,128,4,128]", "num_hidden_layers=4", "sliding_window=16", "index_topk=2"}, 4, DSV4_MODE_EXACT, DSV4_KV_F32},
    {"EXACT flash-like, topk above row count", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=128"}, 3, DSV4_MODE_EXACT, DSV4_KV_F32},
    {"EXACT flash-like, fp8 KV", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_EXACT, DSV4_KV_FP8},
    {"OFFICIAL flash-like", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_F32},
    {"OFFICIAL pro-like", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_F32},
    {"OFFICIAL flash-like, fp8 KV", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_FP8},
    {"OFFICIAL pro-like, bf16 KV", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_BF16},
    /* K >= 1024 in every FP8/FP4 linear (hidden, q_lora, expert FFN, o_groups x o_lora): the tensor-core linears
     * use all four of their partial sums, and their bits differ from the CUDA-core path's (tests/gpu/cli.sh checks
     * that), so this row holds the matrix on the tensor-core path; at the presets' K <= 256 the two paths agree */
    {"OFFICIAL flash-like, K >= 1024 (tensor cores), fp8 KV", "flash-tiny",
     {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3", "hidden_size=1024", "q_lora_rank=1024",
      "moe_intermediate_size=1024", "o_lora_rank=512"}, 7, DSV4_MODE_OFFICIAL, DSV4_KV_FP8},
};
#define N_TOPO (int)(sizeof topologies / sizeof topologies[0])

typedef struct {
    dsv4_model *m;
    char dir[256];
    int vocab;
    int32_t tok[SEQ_LEN], other[SEQ_LEN];
    float *ref, *ref_other;   /* one-shot logits of both sequences */
} fixture;

static size_t rows(const fixture *f, int n) { return sizeof(float) * (size_t)n * (size_t)f->vocab; }

static void expect_rows(const fixture *f, const float *got, const float *want, int from, int to, const char *what) {
    for (int p = from; p < to; p++)
        if (memcmp(got + (int64_t)p * f->vocab, want + (int64_t)p * f->vocab, rows(f, 1)))
            fail_msg("%s: position %d differs from the one-shot run", what, p);
}

static void step1(dsv4_model *m, dsv4_seq *s, const int32_t *t, int n, float *out) {
    dsv4_error err;
    dsv4_step_item it = { s, t, n, DSV4_LOGITS_ALL, out };
    if (dsv4_step(m, &it, 1, &err)) fail_msg("step: %s", err.msg);
}

static int setup(void **state, const topology *tp) {
    fixture *f = calloc(1, sizeof *f);
    f->m = tm_make_on(tp->preset, tp->sets, tp->n_sets, 1234, tp->mode, DSV4_DEVICE_CUDA, tp->kv, f->dir);
    if (!f->m) return -1;
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    tm_tokens(f->tok, SEQ_LEN, f->vocab, 99);
    tm_tokens(f->other, SEQ_LEN, f->vocab, 5);
    f->ref = tm_logits(f->m, f->tok, SEQ_LEN, NULL, 0);
    f->ref_other = tm_logits(f->m, f->other, SEQ_LEN, NULL, 0);
    if (!f->ref || !f->ref_other) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    free(f->ref);
    free(f->ref_other);
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

static void not_degenerate(fixture *f) {
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

static void same_every_run(fixture *f) {
    float *l = tm_logits(f->m, f->tok, SEQ_LEN, NULL, 0);
    assert_non_null(l);
    expect_rows(f, l, f->ref, 0, SEQ_LEN, "a second one-shot run");
    free(l);
}

static void one_shot_lengths(fixture *f) {
    static const int lengths[] = {1, 2, 3, 4, 5, 8, 9, 17, 127, 128, 129};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        float *l = tm_logits(f->m, f->tok, lengths[i], NULL, 0);
        assert_non_null(l);
        if (memcmp(l, f->ref, rows(f, lengths[i]))) fail_msg("one-shot of %d tokens differs", lengths[i]);
        free(l);
    }
}

static void prefill_then_decode(fixture *f) {
    static const int prefixes[] = {1, 3, 4, 5, 8, 9, 16, 17, 127, 128, 129, 256};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        const int k = prefixes[i], n = k + 10 > SEQ_LEN ? SEQ_LEN : k + 10;
        int chunks[1] = {k};
        float *l = tm_logits(f->m, f->tok, n, chunks, 1);
        assert_non_null(l);
        char what[64];
        snprintf(what, sizeof what, "prefill %d then decode", k);
        expect_rows(f, l, f->ref, 0, n, what);
        free(l);
    }
}

static void token_by_token_and_chunks(fixture *f) {
    int one[1] = {1};
    float *l = tm_logits(f->m, f->tok, SEQ_LEN, one, 1);
    assert_non_null(l);
    expect_rows(f, l, f->ref, 0, SEQ_LEN, "token by token");
    free(l);
    dsv4_rng r;
    dsv4_rng_seed(&r, 7);
    for (int trial = 0; trial < 3; trial++) {
        int chunks[SEQ_LEN], n = 0, sum = 0;
        while (sum < SEQ_LEN) {
            const int c = 1 + (int)dsv4_rng_below(&r, trial % 2 ? 9 : 70);
            chunks[n++] = c;
            sum += c;
        }
        l = tm_logits(f->m, f->tok, SEQ_LEN, chunks, n);
        assert_non_null(l);
        expect_rows(f, l, f->ref, 0, SEQ_LEN, "random chunks");
        free(l);
    }
}

/* Both sequences advance in the same steps with different chunk sizes, and the second joins late. */
static void batched_with_neighbours(fixture *f) {
    dsv4_error err;
    dsv4_seq *a, *b;
    if (dsv4_seq_new(f->m, &a, &err) || dsv4_seq_new(f->m, &b, &err)) fail_msg("%s", err.msg);
    float *la = malloc(rows(f, SEQ_LEN)), *lb = malloc(rows(f, SEQ_LEN));
    int da = 0, db = 0, round = 0;
    while (da < SEQ_LEN || db < SEQ_LEN) {
        dsv4_step_item it[2];
        int n = 0;
        int ca = 1 + (round * 7) % 23, cb = round < 3 ? 0 : 1 + (round * 5) % 11;
        if (ca > SEQ_LEN - da) ca = SEQ_LEN - da;
        if (cb > SEQ_LEN - db) cb = SEQ_LEN - db;
        if (cb) it[n++] = (dsv4_step_item){ b, f->other + db, cb, DSV4_LOGITS_ALL, lb + (int64_t)db * f->vocab };
        if (ca) it[n++] = (dsv4_step_item){ a, f->tok + da, ca, DSV4_LOGITS_ALL, la + (int64_t)da * f->vocab };
        if (n && dsv4_step(f->m, it, n, &err)) fail_msg("batched step: %s", err.msg);
        da += ca;
        db += cb;
        round++;
    }
    expect_rows(f, la, f->ref, 0, SEQ_LEN, "batched (first stream)");
    expect_rows(f, lb, f->ref_other, 0, SEQ_LEN, "batched (second stream)");
    free(la);
    free(lb);
    dsv4_seq_free(a);
    dsv4_seq_free(b);
}

/* Save at k (mid compressor chunk, after a window wrap, after a 128-chunk), restore into a fresh sequence and
 * into a used one, continue; fork at k and continue both. */
static void save_restore_fork(fixture *f) {
    static const int at[] = {5, 10, 129, 131};
    dsv4_error err;
    float *l = malloc(rows(f, SEQ_LEN));
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        const int k = at[i];
        dsv4_seq *s, *r, *used, *fk;
        if (dsv4_seq_new(f->m, &s, &err)) fail_msg("%s", err.msg);
        step1(f->m, s, f->tok, k, l);
        void *buf;
        size_t len;
        if (dsv4_seq_save_mem(s, &buf, &len, &err)) fail_msg("save: %s", err.msg);
        if (dsv4_seq_load_mem(f->m, buf, len, &r, &err)) fail_msg("load: %s", err.msg);
        if (dsv4_seq_new(f->m, &used, &err)) fail_msg("%s", err.msg);
        step1(f->m, used, f->other, 40, l);
        if (dsv4_seq_restore_mem(used, buf, len, &err)) fail_msg("restore: %s", err.msg);
        if (dsv4_seq_fork(s, &fk, &err)) fail_msg("fork: %s", err.msg);
        /* a state saved again right after loading is byte-identical */
        void *buf2;
        size_t len2;
        if (dsv4_seq_save_mem(r, &buf2, &len2, &err)) fail_msg("save: %s", err.msg);
        if (len2 != len || memcmp(buf, buf2, len)) fail_msg("save(load(state at %d)) differs from the state", k);
        free(buf2);
        dsv4_seq *all[4] = { s, r, used, fk };
        for (int j = 0; j < 4; j++) {
            step1(f->m, all[j], f->tok + k, SEQ_LEN - k, l + (int64_t)k * f->vocab);
            char what[64];
            snprintf(what, sizeof what, "%s at %d", (const char *[]){"continued", "loaded", "restored", "forked"}[j], k);
            expect_rows(f, l, f->ref, k, SEQ_LEN, what);
        }
        for (int j = 0; j < 4; j++) dsv4_seq_free(all[j]);
        free(buf);
    }
    free(l);
}

/* Speculative steps of k tokens (garbage after the first `keep`), rolled back to keep, then the truth. */
static void rollback(fixture *f) {
    dsv4_error err;
    float *l = malloc(rows(f, SEQ_LEN)), *junk = malloc(rows(f, 16));
    int32_t bad[16];
    tm_tokens(bad, 16, f->vocab, 3);
    dsv4_seq *s;
    if (dsv4_seq_new(f->m, &s, &err)) fail_msg("%s", err.msg);
    int p = 0;
    dsv4_rng r;
    dsv4_rng_seed(&r, 11);
    while (p < SEQ_LEN) {
        const int k = 1 + (int)dsv4_rng_below(&r, 8), keep = (int)dsv4_rng_below(&r, (uint32_t)k + 1);
        if (p + k > SEQ_LEN) break;
        int32_t spec[16];
        for (int j = 0; j < k; j++) spec[j] = j < keep ? f->tok[p + j] : bad[j];
        dsv4_seq_snapshot *snap;
        if (dsv4_seq_snapshot_new(s, &snap, &err)) fail_msg("%s", err.msg);
        step1(f->m, s, spec, k, junk);
        if (memcmp(junk, f->ref + (int64_t)p * f->vocab, rows(f, keep ? keep : 0)))
            fail_msg("speculative step at %d: kept rows differ", p);
        if (dsv4_seq_rollback(s, snap, keep, &err)) fail_msg("rollback: %s", err.msg);
        dsv4_seq_snapshot_free(snap);
        p += keep;
        if (p < SEQ_LEN) {
            step1(f->m, s, f->tok + p, 1, l + (int64_t)p * f->vocab);
            expect_rows(f, l, f->ref, p, p + 1, "after rollback");
            p++;
        }
    }
    dsv4_seq_free(s);
    free(l);
    free(junk);
}

static void parity(void **state) {
    fixture *f = *state;
    not_degenerate(f);
    same_every_run(f);
    one_shot_lengths(f);
    prefill_then_decode(f);
    token_by_token_and_chunks(f);
    batched_with_neighbours(f);
    save_restore_fork(f);
    rollback(f);
}

#define TOPO(i) static int setup_##i(void **s) { return setup(s, &topologies[i]); }
TOPO(0) TOPO(1) TOPO(2) TOPO(3) TOPO(4) TOPO(5) TOPO(6) TOPO(7) TOPO(8) TOPO(9) TOPO(10)

int main(void) {
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu parity: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    int (*setups[])(void **) = { setup_0, setup_1, setup_2, setup_3, setup_4, setup_5, setup_6, setup_7, setup_8, setup_9, setup_10 };
    _Static_assert(sizeof setups / sizeof setups[0] == N_TOPO, "one TOPO(i) per topology");
    struct CMUnitTest tests[N_TOPO];
    for (int i = 0; i < N_TOPO; i++) tests[i] = (struct CMUnitTest){ topologies[i].name, parity, setups[i], teardown, NULL };
    return _cmocka_run_group_tests("gpu parity (memcmp)", tests, N_TOPO, NULL, NULL);
}
