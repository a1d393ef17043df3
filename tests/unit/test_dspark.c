/* The DSpark drafter (spec §14) on a `dsv4 tiny --mtp dspark` checkpoint: greedy speculation with it emits
 * exactly the plain greedy tokens (several streams verified in one step) with the target holding exactly the
 * committed tokens after every step (the drafter's context ring refuses any row that is not the next committed
 * position, so a rejected or skipped position would fail the step), the confidence threshold cuts
 * the proposals, and sampled speculation runs to completion. Its drafts come from random weights and are
 * rarely accepted; losslessness does not depend on that. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/drafter_dspark.h"
#include "engine/speculative.h"
#include "helpers/testmodel.h"

typedef struct {
    dsv4_model *m;
    char dir[256];
    int vocab;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    char tmpl[] = "/tmp/dsv4-test-XXXXXX";
    if (!mkdtemp(tmpl)) return -1;
    strcpy(f->dir, tmpl);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s tiny -o %s --mtp dspark --seed 6 --set compress_ratios=[0,0,4,128,4,128] "
             "--set sliding_window=8 --set index_topk=3 >/dev/null", getenv("DSV4_BIN") ? getenv("DSV4_BIN") : "build/dsv4", f->dir);
    if (system(cmd)) return -1;
    dsv4_load_opts lo = { .mode = DSV4_MODE_EXACT, .quiet = 1 };
    dsv4_error err;
    if (dsv4_model_load(f->dir, &lo, &f->m, &err)) { fprintf(stderr, "%s\n", err.msg); return -1; }
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

static dsv4_spec_stream *stream(fixture *f, const int32_t *prompt, int n, const dsv4_sampling *sp, int new_tokens,
                                float threshold) {
    dsv4_drafter dr;
    dsv4_error err;
    if (dsv4_drafter_dspark(f->m, sp, &dr, &err)) fail_msg("%s", err.msg);
    dsv4_spec_opts o = { .draft = 5, .max_new_tokens = new_tokens, .conf_threshold = threshold };
    dsv4_spec_stream *st;
    if (dsv4_spec_stream_new(f->m, prompt, n, sp, &o, &dr, &st, &err)) fail_msg("%s", err.msg);
    return st;
}

/* Greedy, two streams verified together, across window wraps and compressor emissions. */
static void greedy_is_lossless(void **state) {
    fixture *f = *state;
    enum { NEW = 140 };
    int32_t p1[12], p2[3], plain1[NEW], plain2[NEW];
    tm_tokens(p1, 12, f->vocab, 21);
    tm_tokens(p2, 3, f->vocab, 22);
    assert_int_equal(tm_greedy(f->m, p1, 12, NEW, plain1), 0);
    assert_int_equal(tm_greedy(f->m, p2, 3, NEW, plain2), 0);
    dsv4_sampling sp = { .temperature = 0.0f, .top_p = 1.0f };
    dsv4_spec_stream *ss[2] = { stream(f, p1, 12, &sp, NEW, 0.0f), stream(f, p2, 3, &sp, NEW, 0.0f) };
    dsv4_error err;
    while (!dsv4_spec_stream_done(ss[0]) || !dsv4_spec_stream_done(ss[1])) {
        if (dsv4_spec_step(f->m, ss, 2, &err)) fail_msg("%s", err.msg);
        /* the target sequence holds every committed token but the pending one */
        for (int i = 0; i < 2; i++) {
            int n;
            dsv4_spec_stream_output(ss[i], &n);
            const int64_t committed = (i ? 3 : 12) - 1 + n;
            assert_true(dsv4_seq_position(dsv4_spec_stream_seq(ss[i])) == committed);
        }
    }
    int n1, n2;
    const int32_t *o1 = dsv4_spec_stream_output(ss[0], &n1), *o2 = dsv4_spec_stream_output(ss[1], &n2);
    assert_int_equal(n1, NEW);
    assert_int_equal(n2, NEW);
    assert_memory_equal(o1, plain1, sizeof plain1);
    assert_memory_equal(o2, plain2, sizeof plain2);
    dsv4_spec_stats st;
    dsv4_spec_stream_stats(ss[0], &st);
    assert_true(st.proposed >= 4 * (st.steps - 1));   /* a block of drafts every step */
    printf("DSpark greedy: %lld steps, %lld drafts, %lld accepted (random weights)\n", (long long)st.steps,
           (long long)st.proposed, (long long)st.accepted);
    dsv4_spec_stream_free(ss[0]);
    dsv4_spec_stream_free(ss[1]);
}

/* A survival threshold close to 1 cuts almost every block short; the output is still plain greedy's. */
static void confidence_cut(void **state) {
    fixture *f = *state;
    enum { NEW = 40 };
    int32_t p[6], plain[NEW];
    tm_tokens(p, 6, f->vocab, 23);
    assert_int_equal(tm_greedy(f->m, p, 6, NEW, plain), 0);
    dsv4_sampling sp = { .temperature = 0.0f, .top_p = 1.0f };
    dsv4_spec_stream *all = stream(f, p, 6, &sp, NEW, 0.0f), *cut = stream(f, p, 6, &sp, NEW, 0.999f);
    dsv4_error err;
    while (!dsv4_spec_stream_done(all)) assert_int_equal(dsv4_spec_step(f->m, &all, 1, &err), 0);
    while (!dsv4_spec_stream_done(cut)) assert_int_equal(dsv4_spec_step(f->m, &cut, 1, &err), 0);
    dsv4_spec_stats a, c;
    dsv4_spec_stream_stats(all, &a);
    dsv4_spec_stream_stats(cut, &c);
    assert_true(c.proposed < a.proposed);
    int n;
    assert_memory_equal(dsv4_spec_stream_output(cut, &n), plain, sizeof plain);
    dsv4_spec_stream_free(all);
    dsv4_spec_stream_free(cut);
}

/* Sampled speculation (drafts drawn from the Markov-corrected rows, verified by rejection) runs to the end
 * and is reproducible; its distribution is tested for the verifier in test_spec. */
static void sampled_runs(void **state) {
    fixture *f = *state;
    int32_t p[5];
    tm_tokens(p, 5, f->vocab, 24);
    dsv4_sampling sp = { .temperature = 0.9f, .top_p = 0.95f, .seed = 77 };
    int32_t out[2][60];
    for (int r = 0; r < 2; r++) {
        dsv4_spec_stream *s = stream(f, p, 5, &sp, 60, 0.0f);
        dsv4_error err;
        while (!dsv4_spec_stream_done(s)) assert_int_equal(dsv4_spec_step(f->m, &s, 1, &err), 0);
        int n;
        const int32_t *o = dsv4_spec_stream_output(s, &n);
        assert_int_equal(n, 60);
        memcpy(out[r], o, sizeof out[r]);
        dsv4_spec_stream_free(s);
    }
    assert_memory_equal(out[0], out[1], sizeof out[0]);
}

static void needs_head(void **state) {
    char dir[256];
    dsv4_model *m = tm_make("flash-tiny", NULL, 0, 1, DSV4_MODE_EXACT, dir);
    assert_non_null(m);
    dsv4_sampling sp = { .temperature = 0.0f, .top_p = 1.0f };
    dsv4_drafter dr;
    dsv4_error err;
    assert_int_not_equal(dsv4_drafter_dspark(m, &sp, &dr, &err), 0);
    assert_non_null(strstr(err.msg, "DSpark"));
    dsv4_model_free(m);
    tm_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_is_lossless),
        cmocka_unit_test(confidence_cut),
        cmocka_unit_test(sampled_runs),
        cmocka_unit_test(needs_head),
    };
    return cmocka_run_group_tests_name("DSpark drafter", tests, setup, teardown);
}
