/* Conformance against DeepSeek's official inference code (issue 8 part 1): the tiny checkpoint in
 * ../shared/testdata/official/flashlike and golden logits computed by the official inference/model.py in
 * float32 with every quantization simulation off. dsv4 EXACT mode must match them to 1e-4 relative at every
 * golden position, along the official "prefill k, then decode" paths and along our other paths (one call,
 * token by token, random chunks). OFFICIAL mode is compared with the official-numerics goldens as statistics
 * only (those numerics are chaotic on a random tiny model; see testdata/README.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "helpers/testmodel.h"
#include "util/npy.h"

#define MAX_REL 1e-4

static char data_dir[1024];

static const char *official_dir(void) {
    const char *root = getenv("DSV4_ROOT");
    snprintf(data_dir, sizeof data_dir, "%s/../shared/testdata/official/flashlike", root ? root : ".");
    return data_dir;
}

typedef struct {
    json_t *runs;
    dsv4_model *exact, *official;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    char path[1200];
    snprintf(path, sizeof path, "%s/runs.json", official_dir());
    json_error_t je;
    f->runs = json_load_file(path, 0, &je);
    if (!f->runs) { fprintf(stderr, "%s: %s\n", path, je.text); return -1; }
    snprintf(path, sizeof path, "%s/checkpoint", official_dir());
    dsv4_error err;
    dsv4_load_opts lo = { .mode = DSV4_MODE_EXACT, .quiet = 1 };
    if (dsv4_model_load(path, &lo, &f->exact, &err)) { fprintf(stderr, "%s\n", err.msg); return -1; }
    lo.mode = DSV4_MODE_OFFICIAL;
    if (dsv4_model_load(path, &lo, &f->official, &err)) { fprintf(stderr, "%s\n", err.msg); return -1; }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    json_decref(f->runs);
    dsv4_model_free(f->exact);
    dsv4_model_free(f->official);
    free(f);
    return 0;
}

static int32_t *sequence(fixture *f, const char *name, int *n) {
    json_t *a = json_object_get(json_object_get(f->runs, "tokens"), name);
    *n = (int)json_array_size(a);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)*n);
    for (int i = 0; i < *n; i++) t[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return t;
}

static float *golden(const char *kind, const char *stem, int64_t *rows, int64_t *cols) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s-%s.npy", official_dir(), kind, stem);
    float *g;
    dsv4_error err;
    if (npy_read_f32(path, &g, rows, cols, &err)) fail_msg("%s", err.msg);
    return g;
}

/* max |a - g| / max |g| over one row */
static double rel_err(const float *a, const float *g, int n) {
    double dmax = 0, gmax = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - g[i]);
        if (!(d <= dmax)) dmax = d;   /* NaN propagates as a failure */
        if (fabs(g[i]) > gmax) gmax = fabs(g[i]);
    }
    return dmax / gmax;
}

/* Compare our logits (all positions of the sequence) with a golden whose first row is position first. */
static double compare(const float *ours, const float *g, int64_t rows, int vocab, int first, const char *what) {
    double worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        double e = rel_err(ours + (first + r) * vocab, g + r * vocab, vocab);
        if (!(e <= MAX_REL)) fail_msg("%s: position %lld relative error %.3g > %g", what, (long long)(first + r), e, MAX_REL);
        if (e > worst) worst = e;
    }
    return worst;
}

static void exact_paths(void **state) {
    fixture *f = *state;
    json_t *runs = json_object_get(f->runs, "runs"), *run;
    size_t i;
    double worst = 0;
    int n_runs = 0;
    json_array_foreach(runs, i, run) {
        const char *seqname = json_string_value(json_object_get(run, "seq"));
        const char *stem = json_string_value(json_object_get(run, "file_stem"));
        int k = (int)json_integer_value(json_object_get(run, "k"));
        int first = (int)json_integer_value(json_object_get(run, "first_position"));
        int n;
        int32_t *tok = sequence(f, seqname, &n);
        int64_t rows, cols;
        float *g = golden("exact", stem, &rows, &cols);
        assert_int_equal(cols, 512);
        assert_int_equal(first + rows, n);
        char what[128];
        /* the official path: prefill k tokens in one call, then one token per call */
        int prefill[1] = {k};
        float *l = tm_logits(f->exact, tok, n, prefill, 1);
        snprintf(what, sizeof what, "%s prefill %d + decode", seqname, k);
        double e = compare(l, g, rows, 512, first, what);
        if (e > worst) worst = e;
        free(l);
        /* one call for everything */
        l = tm_logits(f->exact, tok, n, NULL, 0);
        snprintf(what, sizeof what, "%s one-shot vs %s", seqname, stem);
        e = compare(l, g, rows, 512, first, what);
        if (e > worst) worst = e;
        free(l);
        /* chunks of 7, 13, 1, 64, 3, then one at a time */
        int chunks[5] = {7, 13, 1, 64, 3};
        l = tm_logits(f->exact, tok, n, chunks, 5);
        snprintf(what, sizeof what, "%s chunked vs %s", seqname, stem);
        e = compare(l, g, rows, 512, first, what);
        if (e > worst) worst = e;
        free(l);
        free(g);
        free(tok);
        n_runs++;
    }
    assert_int_equal(n_runs, 5);
    printf("EXACT vs official inference/model.py: worst relative error %.3g over %d runs x 3 paths\n", worst, n_runs);
}

/* Statistics only: OFFICIAL mode against the official-numerics goldens (GPU), next to the official code's
 * own prefill-vs-decode spread. */
static void official_statistics(void **state) {
    fixture *f = *state;
    json_t *runs = json_object_get(f->runs, "runs"), *run;
    size_t i;
    double sum = 0, mx = 0, own_sum = 0, own_max = 0;
    long cnt = 0, agree = 0, rows_total = 0, own_cnt = 0;
    json_array_foreach(runs, i, run) {
        const char *seqname = json_string_value(json_object_get(run, "seq"));
        const char *stem = json_string_value(json_object_get(run, "file_stem"));
        int k = (int)json_integer_value(json_object_get(run, "k"));
        int first = (int)json_integer_value(json_object_get(run, "first_position"));
        int n;
        int32_t *tok = sequence(f, seqname, &n);
        int64_t rows, cols;
        float *g = golden("official", stem, &rows, &cols);
        int prefill[1] = {k};
        float *l = tm_logits(f->official, tok, n, prefill, 1);
        assert_non_null(l);
        for (int64_t r = 0; r < rows; r++) {
            const float *a = l + (first + r) * 512, *b = g + r * 512;
            int ba = 0, bb = 0;
            for (int v = 0; v < 512; v++) {
                double d = fabs((double)a[v] - b[v]);
                assert_true(isfinite(a[v]));
                sum += d; cnt++;
                if (d > mx) mx = d;
                if (a[v] > a[ba]) ba = v;
                if (b[v] > b[bb]) bb = v;
            }
            agree += ba == bb;
            rows_total++;
        }
        /* the official code's own spread: its k>1 path against its k=1 path on the same positions */
        if (k > 1) {
            char stem1[64];
            snprintf(stem1, sizeof stem1, "%s-k1", seqname);
            int64_t r1, c1;
            float *g1 = golden("official", stem1, &r1, &c1);
            for (int64_t r = 0; r < rows; r++)
                for (int v = 0; v < 512; v++) {
                    double d = fabs((double)g[r * 512 + v] - g1[(first + r) * 512 + v]);
                    own_sum += d; own_cnt++;
                    if (d > own_max) own_max = d;
                }
            free(g1);
        }
        free(l); free(g); free(tok);
    }
    printf("OFFICIAL mode vs official GPU goldens: mean |d| %.4f, max |d| %.4f, argmax agreement %.1f%% (%ld rows)\n",
           sum / cnt, mx, 100.0 * agree / rows_total, rows_total);
    printf("official code's own prefill-vs-decode spread: mean |d| %.4f, max |d| %.4f\n", own_sum / own_cnt, own_max);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(exact_paths),
        cmocka_unit_test(official_statistics),
    };
    return cmocka_run_group_tests_name("conformance: official inference code", tests, setup, teardown);
}
