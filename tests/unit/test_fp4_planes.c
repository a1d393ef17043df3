/* FP4 weights in nibble planes (model/fp4_planes.h, WF_FP4P): the same codes in another layout, so every reader
 * must give the bits it gives for the checkpoint's layout. Held here by memcmp against the checkpoint's layout,
 * which test_linear_bf16 holds to the pair order's definition:
 *   - the layout itself, from its definition written out here (word k of a group holds column 32 j + k in nibble
 *     j), and the round trip back;
 *   - the pair-order linear in every kernel set this CPU runs, at every token count the fused and tile paths take
 *     (1-20, 40), with row counts that leave partial groups, 1 and 3 threads, a row view, and scales outside the
 *     fast decoders' range (the slow path: the row unpacked);
 *   - the fp32 readers (weight_decode_row, weight_dot_row) in every set;
 *   - a whole OFFICIAL model (the grouped MoE's calls, hash and learned routing): its routed experts repacked in
 *     place give the logits of the checkpoint's layout, one-shot and token by token;
 *   - what is refused (not FP4, columns not a multiple of 128, data not the weight's own) and DSV4_CPU_FP4_PLANES. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/pool.h"
#include "helpers/testmodel.h"
#include "helpers/testweight.h"
#include "model/fp4_planes.h"
#include "model/model.h"

static const char *const sets[] = { "avx512bf16", "avx512", "avx2", "scalar" };

/* A planes copy of t: its own data, the same scales. */
static dsv4_weight planes_of(const test_weight *t, void **data) {
    const size_t n = (size_t)t->w.rows * t->w.cols / 2;
    *data = malloc(n);
    assert_non_null(*data);
    memcpy(*data, t->data, n);
    dsv4_weight p = t->w;
    p.data = *data;
    assert_int_equal(fp4_planes_weight(&p, *data), 0);
    assert_int_equal(p.fmt, WF_FP4P);
    return p;
}

/* bf16-exact inputs of magnitude ~2^-4 .. 2^3 */
static float *inputs(int T, int cols, uint32_t *rng) {
    float *x = malloc(sizeof(float) * (size_t)T * cols);
    assert_non_null(x);
    for (int i = 0; i < T * cols; i++) {
        const uint32_t b = (tw_rnd(rng) & 1u) << 31 | (uint32_t)(123 + tw_rnd(rng) % 8) << 23 | (tw_rnd(rng) & 0x7f) << 16;
        memcpy(&x[i], &b, 4);
    }
    return x;
}

static void layout_by_definition(void **st) {
    (void)st;
    uint32_t rng = 5;
    for (int cols = 128; cols <= 1024; cols *= 2) {
        uint8_t *row = malloc((size_t)cols / 2), *ck = malloc((size_t)cols / 2), *back = malloc((size_t)cols / 2);
        assert_true(row && ck && back);
        for (int i = 0; i < cols / 2; i++) ck[i] = row[i] = (uint8_t)tw_rnd(&rng);
        fp4_planes_pack_row(row, cols);
        for (int c = 0; c < cols; c++) {
            const int g = c / 128, j = (c % 128) / 32, k = c % 32;
            const unsigned word = row[g * 64 + 2 * k] | (unsigned)row[g * 64 + 2 * k + 1] << 8;
            assert_int_equal((word >> (4 * j)) & 15, (ck[c / 2] >> (4 * (c & 1))) & 15);
        }
        fp4_planes_unpack(row, 0, cols, back);
        assert_memory_equal(back, ck, (size_t)cols / 2);
        if (cols >= 256) {   /* a range of groups */
            fp4_planes_unpack(row, 128, cols - 128, back);
            assert_memory_equal(back, ck + 64, (size_t)(cols - 128) / 2);
        }
        free(row); free(ck); free(back);
    }
}

static void linear_same_bits(dsv4_pool *pool, int rows, int cols, int T, int odd_scales, uint32_t *rng) {
    test_weight t = tw_make(WF_FP4, rows, cols, 0, rng);
    assert_non_null(t.data);
    if (odd_scales)   /* a few blocks outside the fast decoders' range (2..252): their rows take the slow path */
        for (int i = 0; i < rows * cols / 32; i += 37) t.scale[i] = (uint8_t)(i % 2 ? 1 : 253);
    void *pd;
    const dsv4_weight p = planes_of(&t, &pd);
    float *x = inputs(T, cols, rng), *y0 = malloc(sizeof(float) * (size_t)T * rows), *y1 = malloc(sizeof(float) * (size_t)T * rows);
    assert_true(y0 && y1);
    cpu_linear_bf16in(pool, CPU_DOTS_PAIRS, &t.w, x, T, cols, y0, rows);
    cpu_linear_bf16in(pool, CPU_DOTS_PAIRS, &p, x, T, cols, y1, rows);
    if (memcmp(y0, y1, sizeof(float) * (size_t)T * rows)) fail_msg("%s: %d x %d, %d tokens: planes differ", dsv4_pool_kernels(pool)->name, rows, cols, T);
    /* a row view from row 8 (scales looked up by global row) */
    if (rows > 16) {
        const dsv4_weight v = weight_rows(&p, 8, rows - 8);
        cpu_linear_bf16in(pool, CPU_DOTS_PAIRS, &v, x, T, cols, y1, rows - 8);
        for (int tt = 0; tt < T; tt++) assert_memory_equal(y1 + (size_t)tt * (rows - 8), y0 + (size_t)tt * rows + 8, sizeof(float) * (rows - 8));
    }
    free(x); free(y0); free(y1); free(pd);
    tw_free(&t);
}

static void pairs_linear_every_set(void **st) {
    (void)st;
    static const int Ts[] = { 1, 2, 3, 4, 5, 6, 7, 9, 12, 16, 17, 20, 40 };
    uint32_t rng = 11;
    for (int s = 0; s < 4; s++) {
        const cpu_kernels *k;
        dsv4_error err;
        if (!cpu_kernels_runnable(sets[s])) continue;
        if (cpu_kernels_pick(sets[s], &k, &err)) fail_msg("%s", err.msg);
        dsv4_pool *p1 = dsv4_pool_new(1), *p3 = dsv4_pool_new(3);
        assert_true(p1 && p3);
        dsv4_pool_set_kernels(p1, k);
        dsv4_pool_set_kernels(p3, k);
        for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
            linear_same_bits(p1, 70, 256, Ts[i], 0, &rng);    /* 70 rows: a partial group */
            linear_same_bits(p3, 64, 512, Ts[i], i % 3 == 0, &rng);
        }
        linear_same_bits(p3, 36, 2048, 1, 1, &rng);
        dsv4_pool_free(p1);
        dsv4_pool_free(p3);
    }
}

static void fp32_readers_every_set(void **st) {
    (void)st;
    uint32_t rng = 23;
    test_weight t = tw_make(WF_FP4, 9, 384, 0, &rng);
    assert_non_null(t.data);
    void *pd;
    const dsv4_weight p = planes_of(&t, &pd);
    float *x = inputs(1, 384, &rng), a[384], b[384], scratch[384];
    for (int s = 0; s < 4; s++) {
        const cpu_kernels *k;
        dsv4_error err;
        if (!cpu_kernels_runnable(sets[s])) continue;
        if (cpu_kernels_pick(sets[s], &k, &err)) fail_msg("%s", err.msg);
        for (int r = 0; r < 9; r++) {
            k->decode_row(&t.w, r, a);
            k->decode_row(&p, r, b);
            assert_memory_equal(a, b, sizeof a);
            const float d0 = k->dot_row(&t.w, r, x, scratch), d1 = k->dot_row(&p, r, x, scratch);
            assert_memory_equal(&d0, &d1, sizeof d0);
        }
    }
    free(x); free(pd);
    tw_free(&t);
}

/* An OFFICIAL tiny model with two compressed-attention kinds, its tokens and its logits one-shot and token by token:
 * the reference a repacked model must give. */
enum { CASE_TOKENS = 40 };
typedef struct {
    char dir[256];
    dsv4_model *m;
    int32_t tok[CASE_TOKENS];
    int n;
    size_t bytes;            /* of one logits array */
    float *ref, *ref1;       /* one-shot, token by token */
} planes_case;
static const int one_token[] = { 1 };

static void case_make(planes_case *c, uint64_t seed, int n, uint64_t tok_seed) {
    const char *cfg[] = { "compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3" };
    c->m = tm_make("flash-tiny", cfg, 3, seed, DSV4_MODE_OFFICIAL, c->dir);
    assert_non_null(c->m);
    if (c->m->weight_memory != ST_MEM_COPY) {   /* the file mapping is read-only: nothing to repack in place */
        dsv4_model_free(c->m);
        tm_rmdir(c->dir);
        skip();
    }
    dsv4_model_info info;
    dsv4_model_get_info(c->m, &info);
    c->n = n;
    tm_tokens(c->tok, n, info.vocab_size, tok_seed);
    c->bytes = sizeof(float) * (size_t)n * (size_t)info.vocab_size;
    c->ref = tm_logits(c->m, c->tok, n, NULL, 0), c->ref1 = tm_logits(c->m, c->tok, n, one_token, 1);
    assert_true(c->ref && c->ref1);
}

static void case_same_logits(const planes_case *c, dsv4_model *m) {
    float *got = tm_logits(m, c->tok, c->n, NULL, 0), *got1 = tm_logits(m, c->tok, c->n, one_token, 1);
    assert_true(got && got1);
    assert_memory_equal(got, c->ref, c->bytes);
    assert_memory_equal(got1, c->ref1, c->bytes);
    free(got); free(got1);
}

static void case_free(planes_case *c) {
    free(c->ref); free(c->ref1);
    dsv4_model_free(c->m);
    tm_rmdir(c->dir);
}

static void model_logits_unchanged(void **st) {
    (void)st;
    planes_case c;
    case_make(&c, 4242, CASE_TOKENS, 5);
    dsv4_model *m = c.m;
    int repacked = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; e < m->cfg.n_routed; e++) {
            dsv4_weight *ws[3] = { &m->layers[l].w1[e], &m->layers[l].w2[e], &m->layers[l].w3[e] };
            for (int k = 0; k < 3; k++) repacked += fp4_planes_weight(ws[k], (void *)ws[k]->data) == 0;
        }
    assert_int_equal(repacked, 3 * m->cfg.n_layers * m->cfg.n_routed);
    case_same_logits(&c, m);
    case_free(&c);
}

/* The switch on a CPU model (model.c cpu_fp4_planes): loaded with DSV4_CPU_FP4_PLANES=1, an OFFICIAL model whose
 * weights are a private copy has every routed expert in planes where the kernels read them (an AVX-512 set), the
 * logits of a load without, one-shot and token by token; an EXACT one has none; a bad value fails the load. */
static void cpu_model_switch(void **st) {
    (void)st;
    planes_case c;
    case_make(&c, 4243, 24, 6);
    const char *isa = dsv4_pool_kernels(c.m->pool)->name;
    const int reads = !strcmp(isa, "avx512bf16") || !strcmp(isa, "avx512");
    const int all = 3 * c.m->cfg.n_layers * c.m->cfg.n_routed;
    setenv("DSV4_CPU_FP4_PLANES", "1", 1);
    dsv4_model *p = tm_load(c.dir, DSV4_MODE_OFFICIAL, DSV4_DEVICE_CPU, DSV4_KV_F32), *e = tm_load(c.dir, DSV4_MODE_EXACT, DSV4_DEVICE_CPU, DSV4_KV_F32);
    setenv("DSV4_CPU_FP4_PLANES", "2", 1);
    dsv4_load_opts bad = { .mode = DSV4_MODE_OFFICIAL, .quiet = 1 };
    dsv4_model *b = NULL;
    dsv4_error err = { 0 };
    const int brc = dsv4_model_load(c.dir, &bad, &b, &err);
    unsetenv("DSV4_CPU_FP4_PLANES");
    assert_true(p && e);
    assert_int_equal(brc, DSV4_E_ARG);
    assert_null(b);
    assert_non_null(strstr(err.msg, "DSV4_CPU_FP4_PLANES"));
    const long planes = fp4_planes_routed(p), exact_planes = fp4_planes_routed(e);
    if (planes != (reads ? all : 0) || exact_planes) fail_msg("%s kernels: %ld of %d experts' weights in planes (EXACT %ld)", isa, planes, all, exact_planes);
    case_same_logits(&c, p);
    dsv4_model_free(p);
    dsv4_model_free(e);
    case_free(&c);
}

static void refusals_and_switch(void **st) {
    (void)st;
    uint32_t rng = 3;
    test_weight t8 = tw_make(WF_FP8, 4, 256, 0, &rng), t4 = tw_make(WF_FP4, 4, 96, 0, &rng), ok = tw_make(WF_FP4, 4, 256, 0, &rng);
    assert_int_equal(fp4_planes_weight(&t8.w, t8.data), -1);
    assert_int_equal(t8.w.fmt, WF_FP8);
    assert_int_equal(fp4_planes_weight(&t4.w, t4.data), -1);   /* 96 columns: not whole groups */
    assert_int_equal(t4.w.fmt, WF_FP4);
    uint8_t other[512];
    assert_int_equal(fp4_planes_weight(&ok.w, other), -1);   /* not the weight's own bytes */
    assert_int_equal(ok.w.fmt, WF_FP4);
    dsv4_error err;
    unsetenv("DSV4_CPU_FP4_PLANES");
    assert_int_equal(fp4_planes_wanted(1, "avx512bf16", 0, &err), 0);   /* unset: the caller's default */
    assert_int_equal(fp4_planes_wanted(1, "avx512bf16", 1, &err), 1);
    assert_int_equal(fp4_planes_wanted(1, "avx2", 1, &err), 0);   /* no fused path reads them */
    assert_int_equal(fp4_planes_wanted(0, "avx512", 1, &err), 0);   /* fp32 or AMX order */
    setenv("DSV4_CPU_FP4_PLANES", "1", 1);
    for (int by_default = 0; by_default < 2; by_default++) {
        assert_int_equal(fp4_planes_wanted(1, "avx512bf16", by_default, &err), 1);
        assert_int_equal(fp4_planes_wanted(1, "avx512", by_default, &err), 1);
        assert_int_equal(fp4_planes_wanted(1, "avx2", by_default, &err), 0);
        assert_int_equal(fp4_planes_wanted(0, "avx512bf16", by_default, &err), 0);
    }
    setenv("DSV4_CPU_FP4_PLANES", "0", 1);
    assert_int_equal(fp4_planes_wanted(1, "avx512bf16", 0, &err), 0);
    assert_int_equal(fp4_planes_wanted(1, "avx512bf16", 1, &err), 0);   /* 0 overrides a default that is on */
    for (int by_default = 0; by_default < 2; by_default++) {
        setenv("DSV4_CPU_FP4_PLANES", "yes", 1);
        memset(&err, 0, sizeof err);
        assert_int_equal(fp4_planes_wanted(1, "avx512bf16", by_default, &err), -1);
        assert_int_equal(err.code, DSV4_E_ARG);
        assert_non_null(strstr(err.msg, "DSV4_CPU_FP4_PLANES"));
    }
    unsetenv("DSV4_CPU_FP4_PLANES");
    tw_free(&t8); tw_free(&t4); tw_free(&ok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(layout_by_definition),
        cmocka_unit_test(pairs_linear_every_set),
        cmocka_unit_test(fp32_readers_every_set),
        cmocka_unit_test(model_logits_unchanged),
        cmocka_unit_test(cpu_model_switch),
        cmocka_unit_test(refusals_and_switch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
