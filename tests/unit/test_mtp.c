/* The V4 MTP head (spec §13): loads from a `dsv4 tiny --mtp v4` checkpoint; its forward obeys the same
 * one-shot == row-by-row == chunked equivalence as the backbone (memcmp, EXACT); it reads the target's final
 * HC state (dsv4_step_item.hidden), which must not depend on how the target's tokens were chunked either. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/mtp.h"
#include "engine/drafter_mtp.h"
#include "engine/speculative.h"
#include "helpers/testmodel.h"

#define N 150

typedef struct {
    dsv4_model *m;
    char dir[256];
    int vocab, hcd;
    int32_t tok[N + 1];
    float *hidden;   /* [N][hcd] target final HC states */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    static const char *sets[] = {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3",
                                 "num_nextn_predict_layers=1"};
    char tmpl[] = "/tmp/dsv4-test-XXXXXX";
    if (!mkdtemp(tmpl)) return -1;
    strcpy(f->dir, tmpl);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s tiny -o %s --mtp v4 --seed 3 --set %s --set %s --set %s >/dev/null",
             getenv("DSV4_BIN") ? getenv("DSV4_BIN") : "build/dsv4", f->dir, sets[0], sets[1], sets[2]);
    if (system(cmd)) { fprintf(stderr, "%s failed\n", cmd); return -1; }
    dsv4_load_opts lo = { .mode = DSV4_MODE_EXACT, .quiet = 1 };
    dsv4_error err;
    if (dsv4_model_load(f->dir, &lo, &f->m, &err)) { fprintf(stderr, "%s\n", err.msg); return -1; }
    if (!dsv4_model_has_mtp(f->m)) { fprintf(stderr, "no MTP head detected\n"); return -1; }
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    f->hcd = 4 * info.dim;
    tm_tokens(f->tok, N + 1, f->vocab, 11);
    f->hidden = malloc(sizeof(float) * (size_t)N * f->hcd);
    dsv4_seq *s;
    if (dsv4_seq_new(f->m, &s, &err)) return -1;
    dsv4_step_item it = { s, f->tok, N, DSV4_LOGITS_NONE, NULL, f->hidden };
    if (dsv4_step(f->m, &it, 1, &err)) { fprintf(stderr, "%s\n", err.msg); return -1; }
    dsv4_seq_free(s);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    free(f->hidden);
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

/* The hidden rows of a token-by-token target run equal those of the one-shot run. */
static void hidden_is_chunking_independent(void **state) {
    fixture *f = *state;
    dsv4_seq *s;
    dsv4_error err;
    assert_int_equal(dsv4_seq_new(f->m, &s, &err), 0);
    float *h = malloc(sizeof(float) * (size_t)f->hcd);
    for (int p = 0; p < N; p++) {
        dsv4_step_item it = { s, f->tok + p, 1, DSV4_LOGITS_NONE, NULL, h };
        assert_int_equal(dsv4_step(f->m, &it, 1, &err), 0);
        if (memcmp(h, f->hidden + (int64_t)p * f->hcd, sizeof(float) * (size_t)f->hcd)) fail_msg("hidden row %d differs", p);
    }
    free(h);
    dsv4_seq_free(s);
}

static float *mtp_run(fixture *f, const int *chunks, int n_chunks) {
    dsv4_seq *st;
    dsv4_error err;
    if (dsv4_seq_new(f->m, &st, &err)) return NULL;
    float *l = malloc(sizeof(float) * (size_t)N * f->vocab);
    int done = 0, ci = 0;
    while (done < N) {
        int len = !chunks ? N : ci < n_chunks ? chunks[ci++] : 1;
        if (len > N - done) len = N - done;
        /* row i pairs X_i with token i+1 */
        if (dsv4_mtp_forward(f->m, st, f->hidden + (int64_t)done * f->hcd, f->tok + done + 1, len, DSV4_LOGITS_ALL,
                             l + (int64_t)done * f->vocab, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            free(l);
            dsv4_seq_free(st);
            return NULL;
        }
        done += len;
    }
    dsv4_seq_free(st);
    return l;
}

static void mtp_parity(void **state) {
    fixture *f = *state;
    float *ref = mtp_run(f, NULL, 0);
    assert_non_null(ref);
    int one[1] = {1}, mixed[5] = {7, 1, 30, 3, 64};
    float *a = mtp_run(f, one, 1), *b = mtp_run(f, mixed, 5);
    assert_non_null(a);
    assert_non_null(b);
    assert_memory_equal(a, ref, sizeof(float) * (size_t)N * f->vocab);
    assert_memory_equal(b, ref, sizeof(float) * (size_t)N * f->vocab);
    /* not degenerate: MTP logits vary across rows */
    int varies = 0;
    for (int v = 0; v < f->vocab && !varies; v++) varies = ref[v] != ref[(int64_t)(N - 1) * f->vocab + v];
    assert_true(varies);
    free(ref);
    free(a);
    free(b);
}

static void mtp_errors(void **state) {
    fixture *f = *state;
    dsv4_seq *st;
    dsv4_error err;
    assert_int_equal(dsv4_seq_new(f->m, &st, &err), 0);
    int32_t bad = f->vocab;
    assert_int_not_equal(dsv4_mtp_forward(f->m, st, f->hidden, &bad, 1, DSV4_LOGITS_NONE, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "vocabulary"));
    assert_int_not_equal(dsv4_mtp_forward(f->m, st, NULL, f->tok, 1, DSV4_LOGITS_NONE, NULL, &err), 0);
    assert_int_equal(dsv4_seq_position(st), 0);   /* nothing moved */
    dsv4_seq_free(st);
}

/* Greedy speculative decoding with the MTP drafter emits exactly the plain greedy tokens, across compressor
 * emissions and window wraps; the drafter is exercised (it proposes every step once it has seen the prompt). */
static void mtp_speculation_is_lossless(void **state) {
    fixture *f = *state;
    enum { PROMPT = 20, NEW = 160 };
    int32_t plain[NEW], *prompt = f->tok;
    assert_int_equal(tm_greedy(f->m, prompt, PROMPT, NEW, plain), 0);
    dsv4_sampling sp = { .temperature = 0.0f, .top_p = 1.0f };
    dsv4_drafter dr;
    dsv4_error err;
    assert_int_equal(dsv4_drafter_mtp(f->m, &sp, &dr, &err), 0);
    dsv4_spec_opts o = { .draft = 1, .max_new_tokens = NEW, .stop_on_eos = 0 };
    dsv4_spec_stream *st;
    if (dsv4_spec_stream_new(f->m, prompt, PROMPT, &sp, &o, &dr, &st, &err)) fail_msg("%s", err.msg);
    while (!dsv4_spec_stream_done(st))
        if (dsv4_spec_step(f->m, &st, 1, &err)) fail_msg("%s", err.msg);
    int n;
    const int32_t *got = dsv4_spec_stream_output(st, &n);
    assert_int_equal(n, NEW);
    assert_memory_equal(got, plain, sizeof plain);
    dsv4_spec_stats stats;
    dsv4_spec_stream_stats(st, &stats);
    assert_true(stats.proposed >= stats.steps - 1);   /* a draft every step */
    printf("MTP-1 greedy: %lld steps, %lld drafts, %lld accepted (random weights: little agreement expected)\n",
           (long long)stats.steps, (long long)stats.proposed, (long long)stats.accepted);
    dsv4_spec_stream_free(st);
}

/* A checkpoint without an MTP head refuses the drafter with a clear error. */
static void mtp_drafter_needs_head(void **state) {
    char dir[256];
    dsv4_model *m = tm_make("flash-tiny", NULL, 0, 1, DSV4_MODE_EXACT, dir);
    assert_non_null(m);
    dsv4_sampling sp = { .temperature = 0.0f, .top_p = 1.0f };
    dsv4_drafter dr;
    dsv4_error err;
    assert_int_not_equal(dsv4_drafter_mtp(m, &sp, &dr, &err), 0);
    assert_non_null(strstr(err.msg, "MTP"));
    dsv4_model_free(m);
    tm_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hidden_is_chunking_independent),
        cmocka_unit_test(mtp_parity),
        cmocka_unit_test(mtp_errors),
        cmocka_unit_test(mtp_speculation_is_lossless),
        cmocka_unit_test(mtp_drafter_needs_head),
    };
    return cmocka_run_group_tests_name("V4 MTP head", tests, setup, teardown);
}
