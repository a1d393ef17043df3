/* The streaming kernel of the FP8/FP4 tensor-core linears (backend/cuda/k_mma_stream.cu) against k_mma.cu's small-
 * tile kernel it replaces for up to 8 tokens: the same bits, memcmp, for every output element. Both run through the
 * public calls (cu_mma_linear, cu_mma_linear_pair, cu_mma_expert_linear, cu_mma_expert_linear_pair) with their
 * `stream` argument 1 and 0, each into an output pre-filled with a different byte pattern (so an element one of
 * them leaves unwritten shows too):
 *   - plain linears, FP8 and FP4, T = 1 .. 8, rows 16, 40, 4096 (the CPU shim: 16, 40, 300), K = 128, 4096 (shim:
 *     1024), 1152 / 2080 (FP4: a last chunk of one 32-column block), FP4 K = 96 (one partial chunk: three empty
 *     partials), out_bf16 on and off;
 *   - a view (row0 = 40: FP8 slabs straddling a 128-row scale block), FP4 data only 4-byte aligned (+4, +8, +12)
 *     with scales at +1, +2, +3 (the byte path for scales), FP8 scales at +1;
 *   - pairs of weights of different heights in one launch;
 *   - the routed experts of random plans (1, 4, 13 tokens; 1 to 6 experts a token; tiles of 1 to 8 pairs), by token
 *     and by pair, alone and as both outputs of the pair call, an absent expert (EP_ABSENT_ROW), one expert's FP4
 *     data only 4-byte aligned, max_tiles past n_tiles.
 * Building with NVFLAGS (or the shim's SHIM_FLAGS) including -DDSV4_STREAM_BUG=1 (a fragment bug) or =2 (the
 * partials added in another order) must make it fail. tools/gpu/shim/shim_stream.sh runs it on the CPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cu_mma.h"
#include "backend/cuda/cu_runtime.h"
#include "model/expert_place.h"   /* EP_ABSENT_ROW */
#include "model/tiny.h"           /* dsv4_rng */
#include "model/weight.h"

#ifdef MMA_TEST_SHIM
void *cu_malloc(size_t n) { return aligned_alloc(256, (n + 255) / 256 * 256); }
void cu_free(void *p) { free(p); }
int cu_upload(void *d, const void *s, size_t n) { memcpy(d, s, n); return 0; }
int cu_download(void *d, const void *s, size_t n) { memcpy(d, s, n); return 0; }
int cu_fill_bytes(void *d, int b, size_t n) { memset(d, b, n); return 0; }
int cu_finish(cu_stream st, const char *what, dsv4_error *err) { (void)st; (void)what; (void)err; return 0; }
#define SHIM 1
#else
#define SHIM 0
#endif

static dsv4_rng rng;
static long n_compared;   /* output elements compared, over the run */

static void sync_ok(const char *what) {
    dsv4_error err;
    if (cu_finish(NULL, what, &err)) fail_msg("%s", err.msg);
}

/* A device weight of random bytes (FP8: never the NaN codes; scales 2^-9 .. 2^6), its data `doff` bytes and its
 * scales `soff` bytes past an aligned allocation. */
typedef struct {
    dsv4_weight d;
    void *base, *sbase;
} dweight;

static dweight make_weight(int fmt, int N, int K, int doff, int soff) {
    dweight t;
    memset(&t, 0, sizeof t);
    const int fp4 = fmt == WF_FP4;
    dsv4_weight *w = &t.d;
    w->fmt = fmt;
    w->rows = N;
    w->cols = K;
    w->scale_cols = fp4 ? K / 32 : K / 128;
    const size_t db = fp4 ? (size_t)N * K / 2 : (size_t)N * K;
    const size_t sb = fp4 ? (size_t)N * w->scale_cols : (size_t)((N + 127) / 128) * w->scale_cols;
    uint8_t *h = malloc(db), *hs = malloc(sb);
    for (size_t i = 0; i < db; i++) {
        uint8_t b = (uint8_t)dsv4_rng_below(&rng, 256);
        if (!fp4 && (b & 0x7f) == 0x7f) b = 0;
        h[i] = b;
    }
    for (size_t i = 0; i < sb; i++) hs[i] = (uint8_t)(118 + dsv4_rng_below(&rng, 16));
    uint8_t *d = cu_malloc(db + 64), *s = cu_malloc(sb + 64);
    assert_true(d && s);
    assert_int_equal(cu_upload(d + doff, h, db), 0);
    assert_int_equal(cu_upload(s + soff, hs, sb), 0);
    free(h);
    free(hs);
    t.base = d;
    t.sbase = s;
    w->data = d + doff;
    w->scale = s + soff;
    return t;
}

static void free_weight(dweight *t) {
    cu_free(t->base);
    cu_free(t->sbase);
}

/* P packed rows of K: random values times 2^[-8, 8] per 128 columns, 1 in 16 exactly 0. */
typedef struct {
    uint8_t *q;
    float *s;
    int ldq, lds;
} dact;

static dact make_act(int P, int K) {
    dact a;
    a.ldq = cu_mma_ld(K);
    a.lds = cu_mma_lds(K);
    float *x = malloc(sizeof(float) * P * K);
    for (int t = 0; t < P; t++)
        for (int c0 = 0; c0 < K; c0 += 128) {
            const int e = (int)dsv4_rng_below(&rng, 17) - 8;
            for (int i = c0; i < K && i < c0 + 128; i++)
                x[(int64_t)t * K + i] = dsv4_rng_below(&rng, 16) == 0 ? 0.0f : (float)ldexp(dsv4_rng_normal(&rng), e);
        }
    float *dx = cu_malloc(sizeof(float) * P * K);
    a.q = cu_malloc((size_t)P * a.ldq);
    a.s = cu_malloc(sizeof(float) * P * a.lds);
    assert_true(dx && a.q && a.s);
    assert_int_equal(cu_upload(dx, x, sizeof(float) * P * K), 0);
    dsv4_error err;
    if (cu_mma_pack_act(NULL, dx, K, P, K, a.q, a.ldq, a.s, a.lds, &err)) fail_msg("%s", err.msg);
    sync_ok("pack");
    cu_free(dx);
    free(x);
    return a;
}

static void free_act(dact *a) {
    cu_free(a->q);
    cu_free(a->s);
}

/* n floats of two outputs, memcmp; on a difference, the first element's index and both values. */
static void same_bits(const float *y1, const float *y0, size_t n, const char *what) {
    if (!memcmp(y1, y0, sizeof(float) * n)) {
        n_compared += (long)n;
        return;
    }
    for (size_t i = 0; i < n; i++)
        if (memcmp(&y1[i], &y0[i], 4)) fail_msg("%s: element %zu: streamed %.9g (0x%08x), small tiles %.9g (0x%08x)", what, i, y1[i],
                                                *(const uint32_t *)&y1[i], y0[i], *(const uint32_t *)&y0[i]);
}

/* y = x w^T for T tokens from row t0 of a, with stream = 1 and 0, compared. */
static void linear_both(const dsv4_weight *w, const dact *a, int t0, int T, int out_bf16, const char *what) {
    const int N = w->rows;
    float *dy[2], *y[2];
    for (int s = 0; s < 2; s++) {
        dy[s] = cu_malloc(sizeof(float) * T * N);
        y[s] = malloc(sizeof(float) * T * N);
        assert_true(dy[s] && y[s]);
        assert_int_equal(cu_fill_bytes(dy[s], s ? 0x55 : 0x77, sizeof(float) * T * N), 0);
        dsv4_error err;
        if (cu_mma_linear(NULL, w, a->q + (int64_t)t0 * a->ldq, a->ldq, a->s + (int64_t)t0 * a->lds, a->lds, T, dy[s], N, out_bf16, s, &err))
            fail_msg("%s", err.msg);
        sync_ok("linear");
        assert_int_equal(cu_download(y[s], dy[s], sizeof(float) * T * N), 0);
    }
    char msg[200];
    snprintf(msg, sizeof msg, "%s %dx%d, %d tokens from %d, out_bf16 %d", what, N, w->cols, T, t0, out_bf16);
    same_bits(y[1], y[0], (size_t)T * N, msg);
    for (int s = 0; s < 2; s++) {
        cu_free(dy[s]);
        free(y[s]);
    }
}

static void plain_linears(void **state) {
    (void)state;
    static const int rows[] = { 16, 40, SHIM ? 300 : 4096 };
    static const int k8[] = { 128, SHIM ? 1024 : 4096, 1152 }, k4[] = { 128, SHIM ? 1024 : 4096, 2080, 96 };
    for (int fp4 = 0; fp4 < 2; fp4++) {
        const int fmt = fp4 ? WF_FP4 : WF_FP8, nk = fp4 ? 4 : 3;
        for (int ki = 0; ki < nk; ki++) {
            const int K = fp4 ? k4[ki] : k8[ki];
            dact a = make_act(12, K);
            for (int ri = 0; ri < 3; ri++) {
                const int N = rows[ri];
                dweight w = make_weight(fmt, N, K, 0, 0);
                for (int T = 1; T <= 8; T++) linear_both(&w.d, &a, T & 3, T, T & 1, fp4 ? "FP4" : "FP8");
                free_weight(&w);
            }
            printf("  %s K = %d: rows 16, 40, %d at T = 1 .. 8: streamed = small tiles (memcmp)\n", fp4 ? "FP4" : "FP8", K, rows[2]);
            free_act(&a);
        }
    }
}

/* Views from row 40 (FP8 slabs across a 128-row scale block), FP4 data at +4 / +8 / +12 with scales at +1 / +2 / +3,
 * FP8 scales at +1 (the byte path for scales). */
static void views_and_alignment(void **state) {
    (void)state;
    for (int fp4 = 0; fp4 < 2; fp4++) {
        const int fmt = fp4 ? WF_FP4 : WF_FP8, K = fp4 ? 1120 : 1024, N = 333;
        dact a = make_act(8, K);
        dweight w = make_weight(fmt, N, K, 0, 0);
        const dsv4_weight view = weight_rows(&w.d, 40, 200);
        for (int T = 1; T <= 8; T++) linear_both(&view, &a, 0, T, 0, fp4 ? "FP4 view from row 40" : "FP8 view from row 40");
        free_weight(&w);
        for (int off = fp4 ? 4 : 0; off < 16; off += 4) {
            const int soff = fp4 ? off / 4 : 1;
            dweight m = make_weight(fmt, N, K, fp4 ? off : 0, soff);
            for (int T = 1; T <= 8; T += 3) linear_both(&m.d, &a, 0, T, 1, fp4 ? "FP4 misaligned" : "FP8 scales misaligned");
            free_weight(&m);
            if (!fp4) break;
        }
        printf("  %s: a view from row 40 and %s: streamed = small tiles (memcmp)\n", fp4 ? "FP4" : "FP8",
               fp4 ? "data at +4, +8, +12 with scales at +1, +2, +3" : "scales at +1");
        free_act(&a);
    }
}

/* cu_mma_linear_pair, stream 1 against 0: both outputs. */
static void linear_pairs(void **state) {
    (void)state;
    for (int fp4 = 0; fp4 < 2; fp4++) {
        const int fmt = fp4 ? WF_FP4 : WF_FP8, K = fp4 ? 2080 : 1024, Na = fp4 ? 40 : 333, Nb = fp4 ? 333 : 16;
        dact a = make_act(8, K);
        dweight wa = make_weight(fmt, Na, K, 0, 0), wb = make_weight(fmt, Nb, K, fp4 ? 4 : 0, 0);
        for (int T = 1; T <= 8; T++) {
            float *dya[2], *dyb[2], *ya[2], *yb[2];
            for (int s = 0; s < 2; s++) {
                dya[s] = cu_malloc(sizeof(float) * T * Na);
                dyb[s] = cu_malloc(sizeof(float) * T * Nb);
                ya[s] = malloc(sizeof(float) * T * Na);
                yb[s] = malloc(sizeof(float) * T * Nb);
                assert_int_equal(cu_fill_bytes(dya[s], s ? 0x55 : 0x77, sizeof(float) * T * Na), 0);
                assert_int_equal(cu_fill_bytes(dyb[s], s ? 0x55 : 0x77, sizeof(float) * T * Nb), 0);
                dsv4_error err;
                if (cu_mma_linear_pair(NULL, &wa.d, dya[s], Na, &wb.d, dyb[s], Nb, a.q, a.ldq, a.s, a.lds, T, T & 1, s, &err))
                    fail_msg("%s", err.msg);
                sync_ok("pair");
                assert_int_equal(cu_download(ya[s], dya[s], sizeof(float) * T * Na), 0);
                assert_int_equal(cu_download(yb[s], dyb[s], sizeof(float) * T * Nb), 0);
            }
            same_bits(ya[1], ya[0], (size_t)T * Na, fp4 ? "FP4 pair, first" : "FP8 pair, first");
            same_bits(yb[1], yb[0], (size_t)T * Nb, fp4 ? "FP4 pair, second" : "FP8 pair, second");
            for (int s = 0; s < 2; s++) {
                cu_free(dya[s]); cu_free(dyb[s]); free(ya[s]); free(yb[s]);
            }
        }
        printf("  %s pair %dx%d + %dx%d at T = 1 .. 8: streamed = small tiles (memcmp)\n", fp4 ? "FP4" : "FP8", Na, K, Nb, K);
        free_weight(&wa);
        free_weight(&wb);
        free_act(&a);
    }
}

/* One random plan over NT tokens, PER experts a token, E experts (expert ABSENT without data, expert MIS's FP4
 * data at +4): every output of the four expert calls with stream 1 = with stream 0. */
static void one_plan(int fp4, int NT, int PER, int N, int K) {
    enum { E = 7, ABSENT = 3, MIS = 5, TILES = 64 };
    const int fmt = fp4 ? WF_FP4 : WF_FP8;
    dweight w[E];
    dsv4_weight dws[E], dws2[E];
    for (int e = 0; e < E; e++) {
        w[e] = make_weight(fmt, N, K, fp4 && e == MIS ? 4 : 0, 0);
        dws[e] = w[e].d;
    }
    dws[ABSENT].data = NULL;
    for (int e = 0; e < E; e++) dws2[e] = dws[(e + 2) % E];   /* the pair call's second projection: expert 1 absent there */
    int pick[16][E];
    memset(pick, 0, sizeof pick);
    for (int t = 0; t < NT; t++)
        for (int n = 0; n < PER;) {
            const int e = (int)dsv4_rng_below(&rng, E);
            if (!pick[t][e]) { pick[t][e] = 1; n++; }
        }
    int pair_token[16 * E], tile_expert[TILES], tile_first[TILES], tile_count[TILES], n_tiles = 0, P = 0;
    for (int e = 0; e < E; e++)
        for (int t = 0; t < NT; t++) {
            if (!pick[t][e]) continue;
            if (!n_tiles || tile_expert[n_tiles - 1] != e || tile_count[n_tiles - 1] == CU_MOE_TILE) {
                tile_expert[n_tiles] = e;
                tile_first[n_tiles] = P;
                tile_count[n_tiles++] = 0;
            }
            tile_count[n_tiles - 1]++;
            pair_token[P++] = t;
        }
    dact a = make_act(NT, K), ap = make_act(P, K);
    cu_moe_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.pair_token = cu_malloc(sizeof(int32_t) * P);
    plan.tile_expert = cu_malloc(sizeof(int32_t) * TILES);
    plan.tile_first = cu_malloc(sizeof(int32_t) * TILES);
    plan.tile_count = cu_malloc(sizeof(int32_t) * TILES);
    plan.n_tiles = cu_malloc(sizeof(int32_t));
    dsv4_weight *dexp = cu_malloc(sizeof dws), *dexp2 = cu_malloc(sizeof dws2);
    assert_true(plan.pair_token && plan.tile_expert && plan.tile_first && plan.tile_count && plan.n_tiles && dexp && dexp2);
    assert_int_equal(cu_upload(plan.pair_token, pair_token, sizeof(int32_t) * P), 0);
    assert_int_equal(cu_upload(plan.tile_expert, tile_expert, sizeof(int32_t) * n_tiles), 0);
    assert_int_equal(cu_upload(plan.tile_first, tile_first, sizeof(int32_t) * n_tiles), 0);
    assert_int_equal(cu_upload(plan.tile_count, tile_count, sizeof(int32_t) * n_tiles), 0);
    assert_int_equal(cu_upload(plan.n_tiles, &n_tiles, sizeof(int32_t)), 0);
    assert_int_equal(cu_upload(dexp, dws, sizeof dws), 0);
    assert_int_equal(cu_upload(dexp2, dws2, sizeof dws2), 0);
    const size_t n = (size_t)P * N;
    float *dy[2], *dy2[2], *y[2], *y2[2];
    for (int s = 0; s < 2; s++) {
        dy[s] = cu_malloc(sizeof(float) * n);
        dy2[s] = cu_malloc(sizeof(float) * n);
        y[s] = malloc(sizeof(float) * n);
        y2[s] = malloc(sizeof(float) * n);
        assert_true(dy[s] && dy2[s] && y[s] && y2[s]);
    }
    int absent_rows = 0;
    for (int by_pair = 0; by_pair < 2; by_pair++)
        for (int call = 0; call < 2; call++) {   /* cu_mma_expert_linear, cu_mma_expert_linear_pair */
            const dact *in = by_pair ? &ap : &a;
            for (int s = 0; s < 2; s++) {
                assert_int_equal(cu_fill_bytes(dy[s], s ? 0x55 : 0x77, sizeof(float) * n), 0);
                assert_int_equal(cu_fill_bytes(dy2[s], s ? 0x55 : 0x77, sizeof(float) * n), 0);
                dsv4_error err;
                const int bf = (by_pair + call) & 1;
                if (call == 0 && cu_mma_expert_linear(NULL, dexp, N, K, fmt, &plan, n_tiles + 2, in->q, in->ldq, in->s, in->lds, by_pair, dy[s],
                                                      N, bf, s, &err))
                    fail_msg("%s", err.msg);
                if (call == 1 && cu_mma_expert_linear_pair(NULL, dexp, dexp2, N, K, fmt, &plan, n_tiles + 2, in->q, in->ldq, in->s, in->lds,
                                                           by_pair, dy[s], dy2[s], N, bf, s, &err))
                    fail_msg("%s", err.msg);
                sync_ok("experts");
                assert_int_equal(cu_download(y[s], dy[s], sizeof(float) * n), 0);
                assert_int_equal(cu_download(y2[s], dy2[s], sizeof(float) * n), 0);
            }
            char msg[200];
            snprintf(msg, sizeof msg, "%s experts %dx%d, %d tokens x %d, %s, %s", fp4 ? "FP4" : "FP8", N, K, NT, PER,
                     by_pair ? "rows by pair" : "rows by token", call ? "pair call" : "single call");
            same_bits(y[1], y[0], n, msg);
            if (call) same_bits(y2[1], y2[0], n, msg);
            const float absent = EP_ABSENT_ROW;
            for (size_t i = 0; i < n; i++) absent_rows += !memcmp(&y[1][i], &absent, 4);
        }
    if (!absent_rows && pick[0][ABSENT]) fail_msg("the absent expert's rows are not EP_ABSENT_ROW");
    for (int s = 0; s < 2; s++) {
        cu_free(dy[s]); cu_free(dy2[s]); free(y[s]); free(y2[s]);
    }
    cu_free(plan.pair_token); cu_free(plan.tile_expert); cu_free(plan.tile_first); cu_free(plan.tile_count); cu_free(plan.n_tiles);
    cu_free(dexp); cu_free(dexp2);
    free_act(&a);
    free_act(&ap);
    for (int e = 0; e < E; e++) free_weight(&w[e]);
}

static void experts(void **state) {
    (void)state;
    static const int toks[][2] = { { 1, 6 }, { 4, 3 }, { 13, 2 }, { 16, 5 } };   /* tokens, experts a token */
    for (int fp4 = 0; fp4 < 2; fp4++)
        for (int k = 0; k < 4; k++) {
            const int K = fp4 ? (k & 1 ? 2080 : 1024) : 1024, N = k == 3 ? 40 : (SHIM ? 200 : 2048);
            one_plan(fp4, toks[k][0], toks[k][1], N, K);
            printf("  %s experts %dx%d, %d tokens x %d experts (an absent one, %s): streamed = small tiles (memcmp), by token and by pair, "
                   "single and pair call\n", fp4 ? "FP4" : "FP8", N, K, toks[k][0], toks[k][1], fp4 ? "one at +4" : "aligned");
        }
}

#ifdef MMA_TEST_SHIM
long shim_stream_copies(void);   /* the cp.async copies the shim emulated (tools/gpu/shim/shim_stream.sh) */
#endif

static void summary(void **state) {
    (void)state;
    printf("  %ld output elements compared, all equal\n", n_compared);
#ifdef MMA_TEST_SHIM
    printf("  (shim: %ld cp.async copies, each landing at its group's wait)\n", shim_stream_copies());
    assert_true(shim_stream_copies() > 0);
#endif
    assert_true(n_compared > 0);
}

int main(int argc, char **argv) {
    (void)argv;
#ifndef MMA_TEST_SHIM
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu stream: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
#endif
    if (argc > 1) {
        fprintf(stderr, "usage: test_gpu_stream\n");
        return 2;
    }
    dsv4_rng_seed(&rng, 2027);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plain_linears),
        cmocka_unit_test(views_and_alignment),
        cmocka_unit_test(linear_pairs),
        cmocka_unit_test(experts),
        cmocka_unit_test(summary),
    };
    if (getenv("STREAM_TEST_ONLY")) cmocka_set_test_filter(getenv("STREAM_TEST_ONLY"));
    return cmocka_run_group_tests_name("gpu streaming tensor-core linear = small tiles", tests, NULL, NULL);
}
