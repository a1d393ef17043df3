/* cpu_linear_bf16in, the OFFICIAL linear for bf16-exact inputs, in its two orders of its own: the pair order
 * (backend/cpu/pairs.h, OFFICIAL's default on the CPU) everywhere, and AMX's (backend/cpu/amx.h) on a CPU with
 * AMX-BF16. Every output is the same bits whatever the number of tokens in the call, the chunking, the thread
 * count and the row view (memcmp against one token at a time), and each is the dot product within the rounding
 * of an fp32 accumulation (against a double-precision sum of the exactly decoded weights times the inputs: a
 * wrong decoded weight, a lost tile or a swapped pair exceeds it). The pair order is also held to its
 * definition, written out below from pairs.h's text (fmaf steps on the exact values), bit for bit in every
 * kernel set this CPU runs, including the VDPBF16PS tiles and the cases they must leave to the fp32 steps (tiny
 * inputs, huge weights). A model loaded in either order keeps the parity matrix's memcmp across one-shot,
 * token-by-token and chunked calls. Without AMX its tests report themselves skipped (cpu_linear is
 * test_linear's). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/amx.h"
#include "backend/cpu/cpufeat.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/pairs.h"
#include "model/formats.h"
#include "helpers/testmodel.h"
#include "model/model.h"

static uint32_t rng_state = 777u;
static uint32_t rnd(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}
static float rndf(void) { return (float)rnd() / (float)(1u << 24) * 2.0f - 1.0f; }

typedef struct {
    dsv4_weight w;
    void *data;
    uint8_t *scale;
} test_weight;

/* scale_mode 0: scales 2^-7..2^4 (the exact fast decoders); 1 (FP8): every other block 2^120 with weights
 * below 2, the others 2^-2 (rows outside the fast decoder's scale range, decoded in fp32); 2: as 0 (the inputs
 * are tiny, make_inputs); 3: scales 2^-107..2^73, a different one in every block (the decoders' per-scale
 * constants, e.g. isa/pairs.c's FP4 tables, over most of their range; the smallest products take the fp32 steps) */
static test_weight make_weight(dsv4_wfmt fmt, int rows, int cols, int scale_mode) {
    test_weight t = {0};
    t.w.fmt = fmt;
    t.w.rows = rows;
    t.w.cols = cols;
    size_t nbytes = fmt == WF_BF16 ? 2 * (size_t)rows * cols : fmt == WF_FP8 ? (size_t)rows * cols : (size_t)rows * cols / 2;
    t.w.scale_cols = fmt == WF_FP8 ? (cols + 127) / 128 : cols / 32;
    t.data = malloc(nbytes);
    assert_non_null(t.data);
    if (fmt == WF_BF16)
        for (size_t i = 0; i < (size_t)rows * cols; i++) ((uint16_t *)t.data)[i] = f32_to_bf16(ldexpf(rndf(), (int)(rnd() % 9) - 4));
    else
        for (size_t i = 0; i < nbytes; i++) {
            uint8_t b = (uint8_t)rnd();
            if (fmt == WF_FP8 && (b & 0x7f) == 0x7f) b ^= 1;   /* no NaN codes in weights */
            if (scale_mode == 1) b &= 0xbf;
            ((uint8_t *)t.data)[i] = b;
        }
    if (fmt != WF_BF16) {
        const int srows = fmt == WF_FP8 ? (rows + 127) / 128 : rows;
        t.scale = malloc((size_t)srows * t.w.scale_cols);
        assert_non_null(t.scale);
        for (int i = 0; i < srows * t.w.scale_cols; i++)
            t.scale[i] = (uint8_t)(scale_mode == 1 ? (i % 2 ? 247 : 125) : scale_mode == 3 ? 20 + rnd() % 181 : 120 + rnd() % 12);
    }
    t.w.data = t.data;
    t.w.scale = t.scale;
    return t;
}

/* T tokens of bf16-exact inputs: random values FP8-quantized per 128 columns, as OFFICIAL linear inputs are;
 * scale_mode 1: near 2^-100 (against weights near 2^120); 2: 2^-112..2^-120, so that products and partial sums
 * fall below FLT_MIN and some inputs are denormal themselves */
static float *make_inputs(int T, int cols, int ldx, int scale_mode) {
    float *x = calloc((size_t)T * ldx, sizeof(float));
    assert_non_null(x);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < cols; i++) x[(size_t)t * ldx + i] = ldexpf(rndf(), scale_mode == 1 ? -100 : scale_mode == 2 ? -112 - (int)(rnd() % 8) : (int)(rnd() % 7) - 3);
        if (scale_mode == 2)   /* bf16s (act_quant's floor on the block maximum would make these zeros) */
            for (int i = 0; i < cols; i++) x[(size_t)t * ldx + i] = round_bf16(x[(size_t)t * ldx + i]);
        else
            act_quant_fp8_inplace(x + (size_t)t * ldx, cols, 128);
    }
    return x;
}

/* The pair order's definition (pairs.h), one output: the row's exact values and the token's as bf16s (they are),
 * 32-column chunks padded with zeros, lane j: odd column then even column, fmaf each; the halving tree. */
static float pairs_definition(const float *w, const float *x, int cols) {
    float L[16] = {0};
    for (int c = 0; c < cols; c += 32)
        for (int j = 0; j < 16; j++) {
            const int i1 = c + 2 * j + 1, i0 = c + 2 * j;
            if (i1 < cols) L[j] = fmaf(w[i1], x[i1], L[j]);
            else L[j] = fmaf(0.0f, 0.0f, L[j]);
            if (i0 < cols) L[j] = fmaf(w[i0], x[i0], L[j]);
            else L[j] = fmaf(0.0f, 0.0f, L[j]);
        }
    for (int s = 8; s > 0; s >>= 1)
        for (int j = 0; j < s; j++) L[j] = L[j] + L[j + s];
    return L[0];
}

static void check_shape(cpu_dots dots, dsv4_pool *pool1, dsv4_pool *pool3, dsv4_wfmt fmt, int rows, int cols, int T,
                        int scale_mode) {
    test_weight tw = make_weight(fmt, rows, cols, scale_mode);
    const dsv4_weight *w = &tw.w;
    const int ldx = cols + 5, ldy = rows + 3;
    float *x = make_inputs(T, cols, ldx, scale_mode);
    float *y = malloc(sizeof(float) * (size_t)T * ldy), *y3 = malloc(sizeof(float) * (size_t)T * ldy);
    float *one = malloc(sizeof(float) * (size_t)rows), *chunk = malloc(sizeof(float) * (size_t)T * ldy);
    float *row = malloc(sizeof(float) * (size_t)cols);
    assert_true(y && y3 && one && chunk && row);
    cpu_linear_bf16in(pool1, dots, w, x, T, ldx, y, ldy);
    cpu_linear_bf16in(pool3, dots, w, x, T, ldx, y3, ldy);
    /* a chunking: pieces of 1..20 tokens */
    for (int t0 = 0; t0 < T;) {
        const int want = 1 + (int)(rnd() % 20), n = want < T - t0 ? want : T - t0;
        cpu_linear_bf16in(pool3, dots, w, x + (size_t)t0 * ldx, n, ldx, chunk + (size_t)t0 * ldy, ldy);
        t0 += n;
    }
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * ldx;
        cpu_linear_bf16in(pool1, dots, w, xt, 1, ldx, one, rows);
        for (int o = 0; o < rows; o++) {
            const float got = y[(size_t)t * ldy + o];
            if (memcmp(&got, &one[o], sizeof got) || memcmp(&got, &y3[(size_t)t * ldy + o], sizeof got) ||
                memcmp(&got, &chunk[(size_t)t * ldy + o], sizeof got))
                fail_msg("fmt %d rows %d cols %d T %d: (o %d, t %d) all %a one %a 3 threads %a chunked %a", fmt, rows,
                         cols, T, o, t, got, one[o], y3[(size_t)t * ldy + o], chunk[(size_t)t * ldy + o]);
        }
    }
    for (int o = 0; o < rows; o++) {
        weight_decode_row(w, o, row);
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * ldx;
            double ref = 0.0, mag = 0.0;
            for (int i = 0; i < cols; i++) { ref += (double)row[i] * xt[i]; mag += fabs((double)row[i] * xt[i]); }
            const float got = y[(size_t)t * ldy + o];
            if (fabs(got - ref) > cols * 6e-8 * mag + 1e-30)
                fail_msg("fmt %d rows %d cols %d: (o %d, t %d) %a, double sum %a (sum |products| %g)", fmt, rows, cols, o, t,
                         got, ref, mag);
            const float def = pairs_definition(row, xt, cols);
            if (dots == CPU_DOTS_PAIRS && memcmp(&got, &def, sizeof got))
                fail_msg("fmt %d rows %d cols %d T %d scale mode %d: (o %d, t %d) %a, the pair order's definition %a", fmt,
                         rows, cols, T, scale_mode, o, t, got, def);
        }
    }
    free(x); free(y); free(y3); free(one); free(chunk); free(row);
    free(tw.data); free(tw.scale);
}

static int have_amx(void) {
    if (cpu_features() & CPU_AMX_BF16) return 1;
    fprintf(stderr, "no AMX-BF16 on this CPU: the AMX kernels cannot run here (cpu_linear is test_linear's)\n");
    return 0;
}

static void same_bits_any_batch(cpu_dots dots, dsv4_pool *p1, dsv4_pool *p3) {
    /* columns past 512 take the chunked decode when T <= 48 and the whole-block decode above */
    static const struct { dsv4_wfmt fmt; int cols[4]; } shapes[] = {
        {WF_BF16, {64, 77, 512, 1100}}, {WF_FP8, {128, 200, 384, 1000}}, {WF_FP4, {32, 96, 288, 1056}},
    };
    static const int rows[] = {1, 16, 37}, Ts[] = {1, 2, 5, 6, 7, 8, 9, 12, 13, 16, 17, 48, 49, 100};   /* fused passes of at most 6 tokens: 5, 6 one; 7, 8, 9, 12 two (8: BF16's most); 13, 16 three (FP8, FP4) */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int c = 0; c < 4; c++)
            for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
                for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
                    check_shape(dots, p1, p3, shapes[s].fmt, rows[r], shapes[s].cols[c], Ts[t], 0);
    /* more rows than one block of the tile path holds (pairs_block_rows: 64 at these widths), the last block and its
     * last row group partial */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) check_shape(dots, p1, p3, shapes[s].fmt, 150, shapes[s].cols[1], 49, 0);
    for (int T = 1; T <= 20; T += 19) check_shape(dots, p1, p3, WF_FP8, 21, 1152, T, 1);   /* the fp32-decoded rows */
    /* inputs near 2^-100: products near FLT_MIN, which the pair order's VDPBF16PS tiles must leave to the fp32
     * steps (pairs_safe) */
    for (int T = 1; T <= 20; T += 19)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) check_shape(dots, p1, p3, shapes[s].fmt, 21, 1056 + 96 * (shapes[s].fmt == WF_FP8), T, 2);
    /* scales spread over 2^-107..2^73: every block its own */
    for (int T = 1; T <= 20; T += 3)
        for (size_t s = 1; s < sizeof shapes / sizeof shapes[0]; s++) check_shape(dots, p1, p3, shapes[s].fmt, 37, 1024, T, 3);
}

static void amx_same_bits_any_batch(void **st) {
    (void)st;
    if (!have_amx()) skip();
    dsv4_pool *p1 = dsv4_pool_new(1), *p3 = dsv4_pool_new(3);
    assert_true(p1 && p3);
    same_bits_any_batch(CPU_DOTS_AMX, p1, p3);
    dsv4_pool_free(p1);
    dsv4_pool_free(p3);
}

/* The pair order in every kernel set this CPU runs (the pools take the set; VDPBF16PS is avx512bf16's). */
static void pairs_same_bits_any_batch(void **st) {
    (void)st;
    static const char *const sets[] = { "avx512bf16", "avx512", "avx2", "scalar" };
    const int quick = getenv("DSV4_QUICK") != NULL;
    printf("  kernel sets here:");
    for (int i = 0; i < 4; i++) printf(" %s%s", sets[i], cpu_kernels_runnable(sets[i]) ? "" : " (cannot run)");
    printf("\n");
    for (int i = 0; i < 4; i++) {
        const cpu_kernels *k;
        dsv4_error err;
        if (!cpu_kernels_runnable(sets[i]) || (quick && i == 3)) continue;
        if (cpu_kernels_pick(sets[i], &k, &err)) fail_msg("%s", err.msg);
        dsv4_pool *p1 = dsv4_pool_new(1), *p3 = dsv4_pool_new(3);
        assert_true(p1 && p3);
        dsv4_pool_set_kernels(p1, k);
        dsv4_pool_set_kernels(p3, k);
        same_bits_any_batch(CPU_DOTS_PAIRS, p1, p3);
        dsv4_pool_free(p1);
        dsv4_pool_free(p3);
    }
}

/* A row view (row0 != 0, FP8 scales looked up by global row) gives the full matrix's bits. */
static void row_view(cpu_dots dots) {
    dsv4_pool *pool = dsv4_pool_new(2);
    assert_non_null(pool);
    test_weight tw = make_weight(WF_FP8, 300, 256, 0);
    const int T = 9;
    float *x = make_inputs(T, 256, 256, 0), *full = malloc(sizeof(float) * T * 300), *part = malloc(sizeof(float) * T * 100);
    assert_true(full && part);
    cpu_linear_bf16in(pool, dots, &tw.w, x, T, 256, full, 300);
    const dsv4_weight v = weight_rows(&tw.w, 150, 100);
    cpu_linear_bf16in(pool, dots, &v, x, T, 256, part, 100);
    for (int t = 0; t < T; t++) assert_memory_equal(part + t * 100, full + t * 300 + 150, sizeof(float) * 100);
    free(x); free(full); free(part); free(tw.data); free(tw.scale);
    dsv4_pool_free(pool);
}

static void amx_row_view(void **st) {
    (void)st;
    if (!have_amx()) skip();
    row_view(CPU_DOTS_AMX);
}

static void pairs_row_view(void **st) {
    (void)st;
    row_view(CPU_DOTS_PAIRS);
}

/* An OFFICIAL model in the order `want` (loaded with cpu_amx, or by default: the pair order): the logits of every
 * position are the same bits in one call, token by token and in random chunks (the parity matrix's claim, for
 * these linears), and differ from the fp32 order's (DSV4_CPU_PAIRS=0): the order is really in use. */
static void model_parity(cpu_dots want) {
    enum { N = 150 };
    char dir[256];
    const char *sets[] = { "compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3" };
    setenv("DSV4_CPU_PAIRS", "0", 1);
    dsv4_model *plain = tm_make("flash-tiny", sets, 3, 1234, DSV4_MODE_OFFICIAL, dir);
    unsetenv("DSV4_CPU_PAIRS");
    assert_non_null(plain);
    assert_int_equal(plain->dots, CPU_DOTS_F32);
    dsv4_load_opts lo = { .mode = DSV4_MODE_OFFICIAL, .quiet = 1, .cpu_amx = want == CPU_DOTS_AMX };
    dsv4_model *m;
    dsv4_error err;
    if (dsv4_model_load(dir, &lo, &m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m->dots, want);
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int32_t tok[N];
    tm_tokens(tok, N, info.vocab_size, 99);
    const size_t bytes = sizeof(float) * N * (size_t)info.vocab_size;
    static const int chunks[] = { 7, 1, 33, 2, 17, 50 }, one[] = { 1 };
    float *ref = tm_logits(m, tok, N, NULL, 0), *by_token = tm_logits(m, tok, N, one, 1);
    float *chunked = tm_logits(m, tok, N, chunks, 6), *fp32 = tm_logits(plain, tok, N, NULL, 0);
    assert_true(ref && by_token && chunked && fp32);
    assert_memory_equal(ref, by_token, bytes);
    assert_memory_equal(ref, chunked, bytes);
    assert_true(memcmp(ref, fp32, bytes) != 0);
    free(ref); free(by_token); free(chunked); free(fp32);
    dsv4_model_free(m);
    dsv4_model_free(plain);
    tm_rmdir(dir);
}

static void amx_model_parity(void **st) {
    (void)st;
    if (!have_amx()) skip();
    model_parity(CPU_DOTS_AMX);
}

static void pairs_model_parity(void **st) {
    (void)st;
    model_parity(CPU_DOTS_PAIRS);
}

/* DSV4_CPU_PAIRS takes 0 or 1 and nothing else (one line naming it). */
static void pairs_env_checked(void **st) {
    (void)st;
    char dir[256];
    dsv4_model *m0 = tm_make("flash-tiny", NULL, 0, 99, DSV4_MODE_OFFICIAL, dir);
    assert_non_null(m0);
    assert_int_equal(m0->dots, CPU_DOTS_PAIRS);
    dsv4_model_free(m0);
    dsv4_load_opts lo = { .mode = DSV4_MODE_OFFICIAL, .quiet = 1 };
    dsv4_model *m = NULL;
    dsv4_error err;
    setenv("DSV4_CPU_PAIRS", "yes", 1);
    assert_int_equal(dsv4_model_load(dir, &lo, &m, &err), DSV4_E_ARG);
    assert_non_null(strstr(err.msg, "DSV4_CPU_PAIRS"));
    assert_null(m);
    unsetenv("DSV4_CPU_PAIRS");
    lo.mode = DSV4_MODE_EXACT;   /* EXACT keeps its fp32 order */
    if (dsv4_model_load(dir, &lo, &m, &err)) fail_msg("%s", err.msg);
    assert_int_equal(m->dots, CPU_DOTS_F32);
    dsv4_model_free(m);
    tm_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pairs_same_bits_any_batch),
        cmocka_unit_test(pairs_row_view),
        cmocka_unit_test(pairs_model_parity),
        cmocka_unit_test(pairs_env_checked),
        cmocka_unit_test(amx_same_bits_any_batch),
        cmocka_unit_test(amx_row_view),
        cmocka_unit_test(amx_model_parity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
