/* cpu_linear's reduction order (backend/cpu/kernels.h, tile.h): every output element equals
 * weight_decode_row + dot_f32 bit for bit (memcmp), whatever the number of tokens in the call, the thread
 * count, the tile padding (rows and tokens not multiples of the tile) and the column tail (columns not a
 * multiple of 32); the fused single-token dot (weight_dot_row) agrees; and the values are the dot products
 * (against a double-precision sum, within a bound that a wrong lane or a dropped tail would exceed). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "model/formats.h"
#include "helpers/testweight.h"

static uint32_t rng_state = 12345u;
static float rndf(void) { return tw_rndf(&rng_state); }

static test_weight make_weight_opt(dsv4_wfmt fmt, int rows, int cols, int big_scale) {
    test_weight t = tw_make(fmt, rows, cols, big_scale, &rng_state);
    assert_non_null(t.data);
    return t;
}
static test_weight make_weight(dsv4_wfmt fmt, int rows, int cols) { return make_weight_opt(fmt, rows, cols, 0); }

static void check_shape_opt(dsv4_pool *pool, dsv4_wfmt fmt, int rows, int cols, int T, int big_scale) {
    test_weight tw = make_weight_opt(fmt, rows, cols, big_scale);
    const dsv4_weight *w = &tw.w;
    const int ldx = cols + 3, ldy = rows + 1;   /* strides other than the widths */
    float *x = malloc(sizeof(float) * (size_t)T * ldx), *y = malloc(sizeof(float) * (size_t)T * ldy);
    float *row = malloc(sizeof(float) * (size_t)cols), *scratch = malloc(sizeof(float) * (size_t)cols);
    float **rows_out = malloc(sizeof(float *) * (size_t)T), *ys = malloc(sizeof(float) * (size_t)T * rows);
    assert_true(x && y && row && scratch && rows_out && ys);
    for (int i = 0; i < T * ldx; i++) x[i] = big_scale ? ldexpf(rndf(), -110) : rndf();
    memset(y, 0, sizeof(float) * (size_t)T * ldy);
    cpu_linear(pool, w, x, T, ldx, y, ldy);
    for (int t = 0; t < T; t++) rows_out[t] = ys + (size_t)t * rows;
    cpu_linear_scatter(pool, w, x, T, ldx, rows_out);
    for (int o = 0; o < rows; o++) {
        weight_decode_row(w, o, row);
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * ldx;
            const float want = dot_f32(row, xt, cols), fused = weight_dot_row(w, o, xt, scratch);
            const float got = y[(size_t)t * ldy + o];
            if (memcmp(&got, &want, sizeof got) || memcmp(&fused, &want, sizeof got) ||
                memcmp(&ys[(size_t)t * rows + o], &want, sizeof got))
                fail_msg("fmt %d rows %d cols %d T %d: (o %d, t %d) linear %a scatter %a fused %a dot_f32 %a", fmt,
                         rows, cols, T, o, t, got, ys[(size_t)t * rows + o], fused, want);
            double ref = 0.0, mag = 0.0;
            for (int i = 0; i < cols; i++) { ref += (double)row[i] * xt[i]; mag += fabs((double)row[i] * xt[i]); }
            if (fabs(got - ref) > cols * 6e-8 * mag + 1e-30)   /* the rigorous bound n*u of an fp32 sum */
                fail_msg("fmt %d cols %d: (o %d, t %d) %g, double sum %g", fmt, cols, o, t, got, ref);
        }
    }
    free(x); free(y); free(row); free(scratch); free(rows_out); free(ys);
    tw_free(&tw);
}

static void check_shape(dsv4_pool *pool, dsv4_wfmt fmt, int rows, int cols, int T) {
    check_shape_opt(pool, fmt, rows, cols, T, 0);
}

static void linear_matches_dot_f32(void **st) {
    (void)st;
    /* the widest of each crosses the tile kernel's column blocks (512) with a partial last block */
    static const struct { dsv4_wfmt fmt; int cols[5]; } shapes[] = {
        {WF_F32, {32, 96, 100, 7, 1063}}, {WF_BF16, {64, 160, 77, 512, 1056}},
        {WF_FP8, {128, 256, 200, 384, 1152}}, {WF_FP4, {32, 64, 96, 288, 1120}},
    };
    static const int rows[] = {1, 5, 13}, Ts[] = {1, 2, 3, 5, 6, 7, 12, 13, 19};
    for (int threads = 1; threads <= 3; threads += 2) {
        dsv4_pool *pool = dsv4_pool_new(threads);
        assert_non_null(pool);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int c = 0; c < 5; c++)
                for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
                    for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
                        check_shape(pool, shapes[s].fmt, rows[r], shapes[s].cols[c], Ts[t]);
        for (int T = 1; T <= 7; T += 3) check_shape_opt(pool, WF_FP8, 5, 384, T, 1);
        dsv4_pool_free(pool);
    }
}

/* The FP8 block scale of a row view (row0 != 0) is looked up by global row: a view and the full matrix agree. */
static void linear_row_view(void **st) {
    (void)st;
    dsv4_pool *pool = dsv4_pool_new(2);
    assert_non_null(pool);
    test_weight tw = make_weight(WF_FP8, 300, 256);
    const int T = 9;
    float *x = malloc(sizeof(float) * T * 256), *full = malloc(sizeof(float) * T * 300), *part = malloc(sizeof(float) * T * 100);
    assert_true(x && full && part);
    for (int i = 0; i < T * 256; i++) x[i] = rndf();
    cpu_linear(pool, &tw.w, x, T, 256, full, 300);
    const dsv4_weight v = weight_rows(&tw.w, 150, 100);
    cpu_linear(pool, &v, x, T, 256, part, 100);
    for (int t = 0; t < T; t++) assert_memory_equal(part + t * 100, full + t * 300 + 150, sizeof(float) * 100);
    free(x); free(full); free(part); tw_free(&tw);
    dsv4_pool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(linear_matches_dot_f32),
        cmocka_unit_test(linear_row_view),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
