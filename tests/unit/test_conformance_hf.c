/* Conformance against Hugging Face transformers' DeepseekV4ForCausalLM (issue 8 part 2): for every folder in
 * tests/data/hf/, a tiny checkpoint in the official format and transformers' float32 no-cache logits
 * (tools/reference/make_hf_golden.py, run on the GPU machine). dsv4 EXACT mode must agree to 1e-4 relative at
 * every position, one-shot and token by token. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "helpers/testmodel.h"
#include "util/npy.h"

#define MAX_REL 1e-4

static double rel_err(const float *a, const float *g, int n) {
    double dmax = 0, gmax = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - g[i]);
        if (!(d <= dmax)) dmax = d;
        if (fabs(g[i]) > gmax) gmax = fabs(g[i]);
    }
    return dmax / gmax;
}

static void check_config(const char *dir, int *n_seqs) {
    char path[1200];
    snprintf(path, sizeof path, "%s/runs.json", dir);
    json_error_t je;
    json_t *runs = json_load_file(path, 0, &je);
    if (!runs) fail_msg("%s: %s", path, je.text);
    snprintf(path, sizeof path, "%s/checkpoint", dir);
    dsv4_model *m;
    dsv4_error err;
    dsv4_load_opts lo = { .mode = DSV4_MODE_EXACT, .quiet = 1 };
    if (dsv4_model_load(path, &lo, &m, &err)) fail_msg("%s", err.msg);
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    const char *name;
    json_t *seq;
    double worst = 0;
    json_object_foreach(json_object_get(runs, "sequences"), name, seq) {
        const int n = (int)json_array_size(seq);
        int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
        for (int i = 0; i < n; i++) tok[i] = (int32_t)json_integer_value(json_array_get(seq, (size_t)i));
        snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(json_object_get(runs, "files"), name)));
        float *g;
        int64_t rows, cols;
        if (npy_read_f32(path, &g, &rows, &cols, &err)) fail_msg("%s", err.msg);
        assert_int_equal(rows, n);
        assert_int_equal(cols, info.vocab_size);
        int one[1] = {1};
        for (int path_kind = 0; path_kind < 2; path_kind++) {
            float *l = tm_logits(m, tok, n, path_kind ? one : NULL, path_kind ? 1 : 0);
            assert_non_null(l);
            for (int p = 0; p < n; p++) {
                double e = rel_err(l + (int64_t)p * cols, g + (int64_t)p * cols, (int)cols);
                if (!(e <= MAX_REL))
                    fail_msg("%s/%s (%s): position %d relative error %.3g", dir, name,
                             path_kind ? "token by token" : "one-shot", p, e);
                if (e > worst) worst = e;
            }
            free(l);
        }
        free(g);
        free(tok);
        (*n_seqs)++;
    }
    printf("%s: worst relative error %.3g (EXACT vs transformers float32)\n", dir, worst);
    dsv4_model_free(m);
    json_decref(runs);
}

static void all_configs(void **state) {
    const char *root = getenv("DSV4_ROOT");
    char base[1024];
    snprintf(base, sizeof base, "%s/tests/data/hf", root ? root : ".");
    DIR *d = opendir(base);
    if (!d) fail_msg("%s: cannot open", base);
    int n_configs = 0, n_seqs = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[1400];
        snprintf(dir, sizeof dir, "%s/%s", base, e->d_name);
        check_config(dir, &n_seqs);
        n_configs++;
    }
    closedir(d);
    assert_true(n_configs >= 2);
    assert_true(n_seqs >= 4);
}

int main(void) {
    const struct CMUnitTest tests[] = { cmocka_unit_test(all_configs) };
    return cmocka_run_group_tests_name("conformance: transformers", tests, NULL, NULL);
}
