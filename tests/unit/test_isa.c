/* The CPU kernel sets (backend/cpu/isa.h) give the same bits: every set this CPU can run computes linears
 * (one token and many, several thread counts), row decodes, fused row dots, FP8 fake quantization and bf16
 * rounding, the indexer's scores (also = their order written out here), and a tiny model's logits in both numeric
 * modes, memcmp-equal to the scalar set's. Also: the sets
 * are different code (else the comparison proves nothing), and the choice fails with one line on an unknown name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "model/formats.h"
#include "util/error.h"
#include "helpers/testmodel.h"
#include "helpers/testweight.h"

static const char *const all_sets[] = { "avx512bf16", "avx512", "avx2", "scalar" };
enum { N_SETS = 4 };

/* DSV4_QUICK (the sanitizer run, where the scalar set's FMAs are library calls): fewer shapes, tokens, modes. */
static int quick(void) { return getenv("DSV4_QUICK") != NULL; }

static uint32_t rng_state = 777u;
static uint32_t rnd(void) { return tw_rnd(&rng_state); }
static float rndf(void) { return tw_rndf(&rng_state); }

static const cpu_kernels *set_named(const char *name) {
    const cpu_kernels *k = NULL;
    dsv4_error err;
    if (cpu_kernels_pick(name, &k, &err)) fail_msg("%s", err.msg);
    return k;
}

/* The sets this CPU runs other than scalar (printed once, so a log shows what was compared). */
static int vector_sets(const cpu_kernels *out[N_SETS]) {
    static int said;
    int n = 0;
    for (int i = 0; i < N_SETS; i++) {
        if (!strcmp(all_sets[i], "scalar")) continue;
        if (cpu_kernels_runnable(all_sets[i])) out[n++] = set_named(all_sets[i]);
        else if (!said) printf("  (this CPU cannot run the %s kernels: not compared)\n", all_sets[i]);
    }
    said = 1;
    return n;
}

/* y = W x with the given set and thread count. */
static float *linear_with(const cpu_kernels *k, int threads, const dsv4_weight *w, const float *x, int T) {
    dsv4_pool *pool = dsv4_pool_new(threads);
    assert_non_null(pool);
    dsv4_pool_set_kernels(pool, k);
    float *y = malloc(sizeof(float) * (size_t)T * w->rows);
    assert_non_null(y);
    cpu_linear(pool, w, x, T, w->cols, y, w->rows);
    dsv4_pool_free(pool);
    return y;
}

static void kernels_same_bits(void **st) {
    (void)st;
    const cpu_kernels *scalar = set_named("scalar"), *vec[N_SETS];
    const int nv = vector_sets(vec);
    static const struct { dsv4_wfmt fmt; int cols[3]; } shapes[] = {
        {WF_F32, {32, 100, 7}}, {WF_BF16, {64, 77, 512}}, {WF_FP8, {128, 200, 384}}, {WF_FP4, {32, 96, 288}},
    };
    static const int Ts[] = {1, 7, 3, 13};
    const int n_T = quick() ? 2 : 4, n_cols = quick() ? 2 : 3;
    const int rows = 11;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int c = 0; c < n_cols; c++) {
            const int cols = shapes[s].cols[c];
            test_weight tw = tw_make(shapes[s].fmt, rows, cols, c == 2, &rng_state);
            assert_non_null(tw.data);
            float *x = malloc(sizeof(float) * 13 * (size_t)cols), *r0 = malloc(sizeof(float) * (size_t)cols),
                  *r1 = malloc(sizeof(float) * (size_t)cols), *scratch = malloc(sizeof(float) * (size_t)cols);
            assert_true(x && r0 && r1 && scratch);
            for (int i = 0; i < 13 * cols; i++) x[i] = rndf();
            for (int t = 0; t < n_T; t++) {
                float *want = linear_with(scalar, 1, &tw.w, x, Ts[t]);
                for (int v = 0; v < nv; v++)
                    for (int threads = 1; threads <= 3; threads += 2) {
                        float *got = linear_with(vec[v], threads, &tw.w, x, Ts[t]);
                        if (memcmp(got, want, sizeof(float) * (size_t)Ts[t] * rows))
                            fail_msg("%s linear, fmt %d cols %d T %d threads %d: differs from scalar", vec[v]->name,
                                     shapes[s].fmt, cols, Ts[t], threads);
                        free(got);
                    }
                free(want);
            }
            for (int o = 0; o < rows; o++) {
                scalar->decode_row(&tw.w, o, r0);
                const float d0 = scalar->dot_row(&tw.w, o, x, scratch);
                for (int v = 0; v < nv; v++) {
                    vec[v]->decode_row(&tw.w, o, r1);
                    assert_memory_equal(r0, r1, sizeof(float) * (size_t)cols);
                    const float d1 = vec[v]->dot_row(&tw.w, o, x, scratch);
                    if (memcmp(&d0, &d1, sizeof d0))
                        fail_msg("%s dot_row fmt %d cols %d row %d: %a, scalar %a", vec[v]->name, shapes[s].fmt, cols,
                                 o, d1, d0);
                }
            }
            free(x); free(r0); free(r1); free(scratch);
            tw_free(&tw);
        }
}

/* FP8 fake quantization and bf16 rounding: random values with ties, subnormals, zeros and non-finite ones. */
static void roundings_same_bits(void **st) {
    (void)st;
    const cpu_kernels *scalar = set_named("scalar"), *vec[N_SETS];
    const int nv = vector_sets(vec);
    enum { N = 4096 + 13 };
    float *src = malloc(sizeof(float) * N), *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    assert_true(src && a && b);
    for (int i = 0; i < N; i++) {
        const uint32_t r = rnd();
        float f = ldexpf(rndf(), (int)(r % 40) - 20);
        if (r % 97 == 0) f = 0.0f;
        else if (r % 89 == 0) f = ldexpf(1.0f + (float)(r % 8) / 8.0f, -130);                 /* subnormal */
        else if (r % 83 == 0) f = 1.0f + ldexpf(1.0f, -8) * (float)(1 + 2 * (r % 4));        /* bf16 tie */
        else if (r % 1009 == 0) f = (r & 256) ? INFINITY : NAN;
        src[i] = f;
    }
    static const int blocks[] = {64, 128, 16};
    for (int v = 0; v < nv; v++) {
        for (size_t k = 0; k < sizeof blocks / sizeof blocks[0]; k++) {
            memcpy(a, src, sizeof(float) * N);
            memcpy(b, src, sizeof(float) * N);
            scalar->act_quant_fp8(a, N, blocks[k]);
            vec[v]->act_quant_fp8(b, N, blocks[k]);
            if (memcmp(a, b, sizeof(float) * N)) fail_msg("%s act_quant_fp8 block %d differs", vec[v]->name, blocks[k]);
        }
        memcpy(a, src, sizeof(float) * N);
        memcpy(b, src, sizeof(float) * N);
        scalar->round_bf16(a, N);
        vec[v]->round_bf16(b, N);
        if (memcmp(a, b, sizeof(float) * N)) fail_msg("%s round_bf16 differs", vec[v]->name);
    }
    free(src); free(a); free(b);
}

/* The indexer's scores (isa/index.c): each set's, for blocks of 1 to 8 rows, = the order written out here (dot_f32 of
 * kernels.h, bf16 in OFFICIAL, the positive heads times their weights added in head order), memcmp; rows with
 * zeros, subnormals, huge values, negated copies of the query (negative dots) and NaN; both modes; head widths a
 * multiple of 32 (the AVX-512 block) and not. */
static float index_score_written(const float *q, const float *w, const float *row, int nI, int cI, int official) {
    float acc = 0.0f;
    for (int h = 0; h < nI; h++) {
        float s = dot_f32(q + h * cI, row, cI);
        if (official) s = round_bf16(s);
        if (s > 0.0f) {
            float t = s * w[h];
            if (official) t = round_bf16(t);
            acc += t;
        }
    }
    return official ? round_bf16(acc) : acc;
}

static void index_scores_same_bits(void **st) {
    (void)st;
    const cpu_kernels *sets[N_SETS + 1];
    int ns = vector_sets(sets);
    sets[ns++] = set_named("scalar");
    static const int shapes[][2] = { { 64, 128 }, { 4, 32 }, { 12, 64 }, { 3, 48 }, { 8, 256 } };
    enum { NR = 24 };
    float *q = malloc(sizeof(float) * 64 * 256), *w = malloc(sizeof(float) * 64), *rows = malloc(sizeof(float) * NR * 256);
    assert_true(q && w && rows);
    int64_t n_checked = 0, n_pos = 0, n_neg = 0;
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const int nI = shapes[sh][0], cI = shapes[sh][1];
        for (int i = 0; i < nI * cI; i++) q[i] = round_bf16(ldexpf(rndf(), (int)(rnd() % 6) - 3));
        for (int h = 0; h < nI; h++) w[h] = round_bf16(rndf());
        for (int r = 0; r < NR; r++) {
            float *x = rows + r * cI;
            for (int j = 0; j < cI; j++) x[j] = rndf() + 0.1f;
            if (r % 6 == 1) for (int j = 0; j < cI; j++) x[j] = -q[j];                         /* negative dots */
            if (r % 6 == 2) for (int j = 0; j < cI; j++) x[j] = ldexpf(x[j], -140);           /* subnormals */
            if (r % 6 == 3) memset(x, 0, sizeof(float) * (size_t)cI);                         /* zeros */
            if (r % 6 == 4) for (int j = 0; j < cI; j += 7) x[j] = ldexpf(x[j], 60);          /* huge terms */
            if (r == 17) x[cI / 2] = NAN;
        }
        for (int official = 0; official <= 1; official++)
            for (int n = 1; n <= CPU_INDEX_ROWS; n++)
                for (int r0 = 0; r0 + n <= NR; r0 += n) {
                    const float *rp[CPU_INDEX_ROWS];
                    for (int r = 0; r < n; r++) rp[r] = rows + (r0 + r) * cI;
                    float want[CPU_INDEX_ROWS];
                    for (int r = 0; r < n; r++) want[r] = index_score_written(q, w, rp[r], nI, cI, official);
                    for (int k = 0; k < ns; k++) {
                        float got[CPU_INDEX_ROWS];
                        sets[k]->index_scores(q, w, rp, n, nI, cI, official, got);
                        for (int r = 0; r < n; r++)
                            if (memcmp(&got[r], &want[r], sizeof(float)))
                                fail_msg("%s index_scores %d x %d, %s, block of %d, row %d: %a, the written order %a", sets[k]->name,
                                         nI, cI, official ? "official" : "exact", n, r0 + r, got[r], want[r]);
                    }
                    for (int r = 0; r < n; r++) {
                        n_checked++;
                        n_pos += want[r] > 0;
                        n_neg += want[r] < 0;
                    }
                }
    }
    printf("  index_scores: %lld scores (%lld > 0, %lld < 0) = the written order in %d sets\n", (long long)n_checked,
           (long long)n_pos, (long long)n_neg, ns);
    free(q); free(w); free(rows);
}

/* A flash-tiny model in each mode: the logits of every position (a prefill chunk, single tokens, another chunk:
 * both the tile and the fused one-token paths) with every set, memcmp against the scalar set. */
static void model_same_bits(void **st) {
    (void)st;
    const cpu_kernels *vec[N_SETS];
    const int nv = vector_sets(vec);
    static const dsv4_mode modes[] = { DSV4_MODE_OFFICIAL, DSV4_MODE_EXACT };
    const int n_modes = quick() ? 1 : 2;   /* OFFICIAL first */
    for (int mi = 0; mi < n_modes; mi++) {
        const int N = quick() ? 12 : 40;
        char dir[256];
        const char *sets[] = { "compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3" };
        dsv4_model *first = tm_make("flash-tiny", sets, 3, 4321, modes[mi], dir);
        assert_non_null(first);
        dsv4_model_free(first);
        dsv4_model_info info;
        float *want = NULL;
        int32_t tok[40];
        static const int chunks[] = { 5, 1, 1, 3, 9, 1, 13, 1 };
        const char *names[N_SETS + 1] = { "scalar" };
        for (int v = 0; v < nv; v++) names[v + 1] = vec[v]->name;
        for (int v = 0; v <= nv; v++) {
            dsv4_load_opts lo = { .mode = modes[mi], .quiet = 1, .n_threads = 2, .cpu_isa = names[v] };
            dsv4_model *m;
            dsv4_error err;
            if (dsv4_model_load(dir, &lo, &m, &err)) fail_msg("%s", err.msg);
            dsv4_model_get_info(m, &info);
            if (v == 0) tm_tokens(tok, N, info.vocab_size, 5);
            float *got = tm_logits(m, tok, N, chunks, 8);
            assert_non_null(got);
            if (v == 0) want = got;
            else {
                if (memcmp(got, want, sizeof(float) * N * (size_t)info.vocab_size))
                    fail_msg("%s mode %d: logits differ from the scalar kernels'", names[v], (int)modes[mi]);
                free(got);
            }
            dsv4_model_free(m);
        }
        free(want);
        tm_rmdir(dir);
    }
}

/* The sets are distinct code; naming one that does not exist, or one this CPU cannot run, fails with one line;
 * DSV4_ISA is read when no set is named. */
static void picking(void **st) {
    (void)st;
    const cpu_kernels *k = NULL, *best = cpu_kernels_best();
    dsv4_error err;
    const cpu_kernels *scalar = set_named("scalar"), *vec[N_SETS];
    const int nv = vector_sets(vec);
    for (int v = 0; v < nv; v++) {
        assert_ptr_not_equal(vec[v], scalar);
        assert_ptr_not_equal(vec[v]->linear_rows, scalar->linear_rows);
        assert_ptr_not_equal(vec[v]->dot_row, scalar->dot_row);
        assert_string_not_equal(vec[v]->name, scalar->name);
    }
    assert_int_equal(cpu_kernels_pick("sse9", &k, &err), DSV4_E_ARG);
    assert_non_null(strstr(err.msg, "sse9"));
    for (int i = 0; i < N_SETS; i++)
        if (!cpu_kernels_runnable(all_sets[i])) {
            assert_int_equal(cpu_kernels_pick(all_sets[i], &k, &err), DSV4_E_UNSUPPORTED);
            assert_non_null(strstr(err.msg, all_sets[i]));
        }
    assert_int_equal(cpu_kernels_pick("auto", &k, &err), 0);
    assert_ptr_equal(k, best);
    setenv("DSV4_ISA", "scalar", 1);
    assert_int_equal(cpu_kernels_pick(NULL, &k, &err), 0);
    assert_ptr_equal(k, scalar);
    setenv("DSV4_ISA", "sse9", 1);
    assert_int_equal(cpu_kernels_pick("", &k, &err), DSV4_E_ARG);
    assert_non_null(strstr(err.msg, "DSV4_ISA"));
    unsetenv("DSV4_ISA");
    assert_int_equal(cpu_kernels_pick(NULL, &k, &err), 0);
    assert_ptr_equal(k, best);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(picking),
        cmocka_unit_test(kernels_same_bits),
        cmocka_unit_test(roundings_same_bits),
        cmocka_unit_test(index_scores_same_bits),
        cmocka_unit_test(model_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
