/* The grouped expert run (core/moe_experts.h: a layer's gate/up projections and activations in one pool
 * dispatch, its down projections in a second) against the expert-by-expert run (three dispatches an expert),
 * bit for bit (memcmp):
 *   - moe_forward's output, on a hash-routed and a score-routed layer, for T = 1 .. 150 tokens: one token
 *     (every call fused, one group), a few, many streams' worth, more active experts than one group takes
 *     (MOE_GROUP_CALLS) and more pairs than the pair buffers hold (moe_pair_cap), so several groups run;
 *   - moe_host_rows' rows and pair numbers with part of the experts on the host;
 *   - with 1, 2, 3 and 8 threads, and the vector instruction sets this CPU runs (at 8 threads and a few tokens a
 *     phase has fewer blocks than 8 a thread, so its blocks are cut into pieces of 64, 32 or 16 rows and each
 *     block's activation runs after its last piece, on whichever thread finished it);
 * in EXACT and OFFICIAL mode, and OFFICIAL on AMX tiles where this CPU has them (m->amx: both ways run the
 * tiles, cpu_linear_amx's bits). The model has 320-wide experts (two full 128-row blocks and a partial one, so
 * the OFFICIAL quantization's last block is a short one) and FP4 routed / FP8 shared experts (unequal row
 * costs, so the threads' parts cut calls in the middle).
 * And OFFICIAL's silu table (m->silu_bf16: silu read by the bf16 bits of the clamped gate) against the function,
 * bit for bit, through moe_forward on both layers; its indexing against values computed by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <math.h>
#include "backend/cpu/isa.h"
#include "core/moe.h"
#include "core/moe_experts.h"
#include "core/workspace.h"
#include "helpers/testmodel.h"
#include "model/model.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
/* wide enough that some gate values pass the SwiGLU clamp (10) */
static float rnd_float(void) { return (float)((int64_t)(rnd() % 2001) - 1000) / 250.0f; }

/* One checkpoint (three layers: two hash-routed, one score-routed), loaded in each mode. */
static char dir[256];
static dsv4_model *model[3];   /* EXACT, OFFICIAL, OFFICIAL on AMX (when this CPU has AMX-BF16) */

static int group_setup(void **state) {
    const char *sets[] = { "n_routed_experts=72", "num_experts_per_tok=6", "moe_intermediate_size=320",
                           "num_hidden_layers=3" };
    model[0] = tm_make("flash-tiny", sets, 4, 23, DSV4_MODE_EXACT, dir);
    if (!model[0]) return -1;
    model[1] = tm_load(dir, DSV4_MODE_OFFICIAL, DSV4_DEVICE_CPU, DSV4_KV_F32);
    const dsv4_load_opts amx = { .mode = DSV4_MODE_OFFICIAL, .quiet = 1, .cpu_amx = 1 };
    dsv4_error err = { 0 };
    const int rc = dsv4_model_load(dir, &amx, &model[2], &err);
    if (rc == DSV4_E_UNSUPPORTED) model[2] = NULL;   /* no AMX-BF16 here: the load refuses --amx, its cases skip */
    else if (rc) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return model[1] ? 0 : -1;
}
static int group_teardown(void **state) {
    for (int i = 0; i < 3; i++) dsv4_model_free(model[i]);
    tm_rmdir(dir);
    return 0;
}
static int pick_exact(void **state) { *state = model[0]; return 0; }
static int pick_official(void **state) { *state = model[1]; return 0; }
static int pick_amx(void **state) { *state = model[2]; return 0; }

/* Give the model a pool of n threads running kernel set k. */
static void use_pool(dsv4_model *m, int n, const cpu_kernels *k) {
    dsv4_pool_free(m->pool);
    m->pool = dsv4_pool_new(n);
    assert_non_null(m->pool);
    assert_int_equal(dsv4_pool_threads(m->pool), n);
    dsv4_pool_set_kernels(m->pool, k);
}

static const cpu_kernels *kernels_named(const char *name) {
    const cpu_kernels *k = NULL;
    dsv4_error err = { 0 };
    if (cpu_kernels_pick(name, &k, &err)) fail_msg("%s", err.msg);
    return k;
}

/* moe_forward on inputs xn [T][d] (and token ids, for the hash layers) the one way or the other: ws->sub. */
static void forward_once(dsv4_model *m, int L, int T, const float *xn, const int32_t *tok, int per_expert, float *out) {
    dsv4_workspace *ws = m->ws;
    ws->batch.T = T;
    memcpy(ws->xn, xn, sizeof(float) * (size_t)T * m->cfg.dim);
    memcpy(ws->batch.tok, tok, sizeof(int32_t) * (size_t)T);
    m->moe_per_expert = per_expert;
    moe_forward(m, &m->layers[L], ws);
    m->moe_per_expert = 0;
    memcpy(out, ws->sub, sizeof(float) * (size_t)T * m->cfg.dim);
}

/* Distinct experts and pairs of the routing moe_forward just made (to show the test reaches several groups). */
static void routing_size(const dsv4_model *m, int T, int *experts, int *pairs) {
    const int E = m->cfg.n_routed, K = m->cfg.n_act;
    int32_t *first = malloc(sizeof(int32_t) * (size_t)(E + 1));
    *pairs = moe_pair_offsets(m->ws->route_e, T, K, E, first);
    *experts = 0;
    for (int e = 0; e < E; e++) *experts += first[e + 1] > first[e];
    free(first);
}

static const int Ts[] = { 1, 2, 5, 16, 64, 150 };
enum { N_T = sizeof Ts / sizeof Ts[0], T_MAX = 150 };

/* T up to t_max */
static void check_forward(dsv4_model *m, int threads, const cpu_kernels *k, int t_max, int *saw_calls, int *saw_pairs) {
    const int d = m->cfg.dim;
    use_pool(m, threads, k);
    float *xn = malloc(sizeof(float) * T_MAX * d), *want = malloc(sizeof(float) * T_MAX * d),
          *got = malloc(sizeof(float) * T_MAX * d);
    int32_t tok[T_MAX];
    for (int i = 0; i < T_MAX * d; i++) xn[i] = rnd_float();
    tm_tokens(tok, T_MAX, m->cfg.vocab_size, 7);
    const int layers[] = { 0, m->cfg.n_layers - 1 };   /* hash-routed, score-routed */
    assert_true(m->layers[0].hash_routed && !m->layers[m->cfg.n_layers - 1].hash_routed);
    for (int li = 0; li < 2; li++)
        for (int ti = 0; ti < N_T && Ts[ti] <= t_max; ti++) {
            const int T = Ts[ti];
            forward_once(m, layers[li], T, xn, tok, 1, want);
            int experts, pairs;
            routing_size(m, T, &experts, &pairs);
            *saw_calls |= experts > MOE_GROUP_CALLS;
            *saw_pairs |= pairs > moe_pair_cap(T, m->cfg.n_act);
            forward_once(m, layers[li], T, xn, tok, 0, got);
            for (int t = 0; t < T; t++)
                if (memcmp(want + (size_t)t * d, got + (size_t)t * d, sizeof(float) * d))
                    fail_msg("%s, %d threads, layer %d, T %d: token %d grouped != one by one", k->name, threads,
                             layers[li], T, t);
        }
    free(xn);
    free(want);
    free(got);
}

static void forward_grouped_is_per_expert(void **state) {
    dsv4_model *m = *state;
    if (!m) skip();   /* the AMX model, on a CPU without AMX-BF16 */
    assert_int_equal(workspace_ensure(m, T_MAX, 0), 0);
    const cpu_kernels *best = dsv4_pool_kernels(m->pool);
    int saw_calls = 0, saw_pairs = 0;
    const int threads[] = { 1, 2, 3, 8 };
    for (int i = 0; i < 4; i++) check_forward(m, threads[i], best, T_MAX, &saw_calls, &saw_pairs);
    /* the vector sets this CPU runs, up to 16 tokens (the scalar set's fmaf calls would take seconds here; it gives
     * the vector sets' bits, test_isa.c, and the grouping only calls whichever set the pool has) */
    const char *sets[] = { "avx512", "avx2" };
    for (int i = 0; i < 2; i++)
        if (cpu_kernels_runnable(sets[i])) check_forward(m, 3, kernels_named(sets[i]), 16, &saw_calls, &saw_pairs);
    /* the cases above must have run several groups in both ways a group ends */
    assert_true(saw_calls);
    assert_true(saw_pairs);
}

static void silu_table_is_the_function(void **state) {
    dsv4_model *m = *state;
    if (!m) skip();
    assert_non_null(m->silu_bf16);
    /* silu(1) = 1 / (1 + e^-1), silu(-1) = -1 / (1 + e), silu(-8) = -8 / (1 + e^8), by hand to 12 digits */
    const float *t = m->silu_bf16;
    assert_true(t[0x0000] == 0.0f && fabs(t[0x3f80] - 0.731058578630) < 1e-7 && fabs(t[0xbf80] + 0.268941421370) < 1e-7 &&
                fabs(t[0xc100] + 0.002682801044) < 1e-9);
    assert_int_equal(workspace_ensure(m, T_MAX, 0), 0);
    use_pool(m, 2, dsv4_pool_kernels(m->pool));
    const int d = m->cfg.dim;
    float *xn = malloc(sizeof(float) * T_MAX * d), *want = malloc(sizeof(float) * T_MAX * d),
          *got = malloc(sizeof(float) * T_MAX * d);
    int32_t tok[T_MAX];
    for (int i = 0; i < T_MAX * d; i++) xn[i] = rnd_float();
    tm_tokens(tok, T_MAX, m->cfg.vocab_size, 9);
    float *table = m->silu_bf16;
    for (int L = 0; L < m->cfg.n_layers; L++)
        for (int ti = 0; ti < N_T; ti++) {
            m->silu_bf16 = NULL;   /* the function, per element */
            forward_once(m, L, Ts[ti], xn, tok, 0, want);
            m->silu_bf16 = table;
            forward_once(m, L, Ts[ti], xn, tok, 0, got);
            if (memcmp(want, got, sizeof(float) * (size_t)Ts[ti] * d)) fail_msg("layer %d, T %d: the silu table differs", L, Ts[ti]);
        }
    free(xn);
    free(want);
    free(got);
}

/* moe_host_rows with experts e % 3 != 1 on the host, the one way or the other. */
static int host_once(dsv4_model *m, int L, int T, const float *xn, const int32_t *re, const float *rw,
                     int per_expert, float *rows, int32_t *pair) {
    uint8_t on_host[72];
    for (int e = 0; e < m->cfg.n_routed; e++) on_host[e] = e % 3 != 1;
    moe_host_scratch scr;
    assert_int_equal(moe_host_scratch_init(&scr, &m->cfg, T), 0);
    m->moe_per_expert = per_expert;
    const int n = moe_host_rows(m, &m->layers[L], on_host, 0, xn, re, rw, T, &scr, rows, pair);
    m->moe_per_expert = 0;
    moe_host_scratch_free(&scr);
    return n;
}

static void host_rows_grouped_is_per_expert(void **state) {
    dsv4_model *m = *state;
    if (!m) skip();
    const int d = m->cfg.dim, E = m->cfg.n_routed, K = m->cfg.n_act, L = m->cfg.n_layers - 1;
    assert_true(E <= 72);
    float *xn = malloc(sizeof(float) * T_MAX * d), *rw = malloc(sizeof(float) * T_MAX * K);
    float *want = malloc(sizeof(float) * T_MAX * K * d), *got = malloc(sizeof(float) * T_MAX * K * d);
    int32_t *re = malloc(sizeof(int32_t) * T_MAX * K), *pw = malloc(sizeof(int32_t) * T_MAX * K),
            *pg = malloc(sizeof(int32_t) * T_MAX * K);
    for (int i = 0; i < T_MAX * d; i++) xn[i] = rnd_float();
    for (int t = 0; t < T_MAX; t++)
        for (int j = 0; j < K; j++) {
            /* a row may name an expert twice (counts once), as a hash table's row may */
            re[t * K + j] = (int32_t)(rnd() % (uint64_t)E);
            rw[t * K + j] = 0.1f + (float)(rnd() % 1000) / 1000.0f;
        }
    const int threads[] = { 1, 3, 8 };
    for (int i = 0; i < 3; i++) {
        use_pool(m, threads[i], dsv4_pool_kernels(m->pool));
        for (int ti = 0; ti < N_T; ti++) {
            const int T = Ts[ti];
            const int nw = host_once(m, L, T, xn, re, rw, 1, want, pw);
            const int ng = host_once(m, L, T, xn, re, rw, 0, got, pg);
            assert_int_equal(ng, nw);
            assert_true(nw > 0);
            assert_memory_equal(pg, pw, sizeof(int32_t) * (size_t)nw);
            if (memcmp(want, got, sizeof(float) * (size_t)nw * d))
                fail_msg("%d threads, T %d: host rows grouped != one by one", threads[i], T);
        }
    }
    free(xn);
    free(rw);
    free(want);
    free(got);
    free(re);
    free(pw);
    free(pg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        { "moe_forward, EXACT", forward_grouped_is_per_expert, pick_exact, NULL, NULL },
        { "moe_forward, OFFICIAL", forward_grouped_is_per_expert, pick_official, NULL, NULL },
        { "moe_host_rows, EXACT", host_rows_grouped_is_per_expert, pick_exact, NULL, NULL },
        { "moe_host_rows, OFFICIAL", host_rows_grouped_is_per_expert, pick_official, NULL, NULL },
        { "moe_forward, OFFICIAL on AMX", forward_grouped_is_per_expert, pick_amx, NULL, NULL },
        { "moe_host_rows, OFFICIAL on AMX", host_rows_grouped_is_per_expert, pick_amx, NULL, NULL },
        { "silu table, OFFICIAL", silu_table_is_the_function, pick_official, NULL, NULL },
        { "silu table, OFFICIAL on AMX", silu_table_is_the_function, pick_amx, NULL, NULL },
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
