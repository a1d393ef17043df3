/* The host's share of a GPU step with experts in host memory (issue 15), checked where it needs no GPU:
 *   - moe_host_rows numbers each row by the GPU plan's rule — pairs by expert, then token, a token naming an
 *     expert twice counting once — recomputed here by brute force over the routing;
 *   - each row is what that token alone gives (memcmp): the host's rows do not depend on the batch, so a step
 *     with host experts stays batch-invariant;
 *   - with every expert on the host, the rows, summed per token in increasing expert id, plus the shared expert,
 *     give moe_forward's output bit for bit: the combine the GPU runs over these rows is the CPU's MoE.
 * Both numeric modes. The GPU side (copies, scatter, overlap) is tests/gpu/test_gpu_host_experts.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "core/moe.h"
#include "core/numerics.h"
#include "core/workspace.h"
#include "helpers/testmodel.h"
#include "model/expert_place.h"
#include "model/model.h"

enum { T = 9 };

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float rnd_float(void) { return (float)((int64_t)(rnd() % 2001) - 1000) / 700.0f; }

typedef struct {
    dsv4_model *m;
    char dir[256];
} fixture;

static int setup_mode(void **state, dsv4_mode mode) {
    fixture *f = calloc(1, sizeof *f);
    const char *sets[] = { "n_routed_experts=8", "num_experts_per_tok=3" };
    f->m = tm_make("flash-tiny", sets, 2, 11, mode, f->dir);
    if (!f->m) return -1;
    *state = f;
    return 0;
}
static int setup_exact(void **state) { return setup_mode(state, DSV4_MODE_EXACT); }
static int setup_official(void **state) { return setup_mode(state, DSV4_MODE_OFFICIAL); }
static int teardown(void **state) {
    fixture *f = *state;
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

/* Routing rows of K experts, the last token naming one expert twice. */
static void make_routing(int E, int K, int32_t *re, float *rw) {
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e, fresh;
            do {
                e = (int)(rnd() % (uint64_t)E);
                fresh = 1;
                for (int q = 0; q < j; q++) fresh &= re[t * K + q] != e;
            } while (!fresh);
            re[t * K + j] = e;
            rw[t * K + j] = 0.1f + (float)(rnd() % 1000) / 1000.0f;
        }
    re[(T - 1) * K + K - 1] = re[(T - 1) * K];   /* a duplicate: counts once, with its first slot's weight */
}

/* The pair index of (t, e) by the plan's rule, by brute force: pairs of smaller experts, then earlier tokens of e. */
static int brute_pair(const int32_t *re, int K, int t, int e) {
    int idx = 0;
    for (int u = 0; u < T; u++)
        for (int j = 0; j < K; j++) {
            int first = 1;
            for (int q = 0; q < j; q++) first &= re[u * K + q] != re[u * K + j];
            if (first && (re[u * K + j] < e || (re[u * K + j] == e && u < t))) idx++;
        }
    return idx;
}

static int routes_to(const int32_t *re, int K, int t, int e) {
    for (int j = 0; j < K; j++)
        if (re[t * K + j] == e) return 1;
    return 0;
}

static void numbering_and_invariance(void **state) {
    fixture *f = *state;
    dsv4_model *m = f->m;
    const int d = m->cfg.dim, E = m->cfg.n_routed, K = m->cfg.n_act, L = m->cfg.n_layers - 1;
    int32_t re[T * 3], pair[T * 3], pair1[3];
    float rw[T * 3], *xn = malloc(sizeof(float) * T * d), *rows = malloc(sizeof(float) * T * K * d), *row1 = malloc(sizeof(float) * K * d);
    for (int i = 0; i < T * d; i++) xn[i] = rnd_float();
    make_routing(E, K, re, rw);
    uint8_t on_host[8];
    for (int e = 0; e < E; e++) on_host[e] = e % 3 != 1;   /* experts 1, 4, 7 stay "on the GPU" */
    moe_host_scratch scr;
    assert_int_equal(moe_host_scratch_init(&scr, &m->cfg, T), 0);
    const int n = moe_host_rows(m, &m->layers[L], on_host, 0, xn, re, rw, T, &scr, rows, pair);
    int i = 0;
    for (int e = 0; e < E; e++) {
        if (!on_host[e]) continue;
        for (int t = 0; t < T; t++) {
            if (!routes_to(re, K, t, e)) continue;
            assert_true(i < n);
            assert_int_equal(pair[i], brute_pair(re, K, t, e));
            /* the same row from this token alone (its routing row, its input) */
            moe_host_scratch one;
            assert_int_equal(moe_host_scratch_init(&one, &m->cfg, 1), 0);
            uint8_t only[8] = { 0 };
            only[e] = 1;
            const int n1 = moe_host_rows(m, &m->layers[L], only, 0, xn + (size_t)t * d, re + t * K, rw + t * K, 1, &one, row1, pair1);
            assert_int_equal(n1, 1);
            assert_memory_equal(row1, rows + (size_t)i * d, sizeof(float) * d);
            moe_host_scratch_free(&one);
            i++;
        }
    }
    assert_int_equal(i, n);
    moe_host_scratch_free(&scr);
    free(xn);
    free(rows);
    free(row1);
}

/* The token split (model/expert_split.h): experts 1, 4, 7 on the GPU, the others split at 50 %. The host's rows are
 * exactly those of the pairs the rule leaves it — worked out here from the rule's statement: of a token's h distinct
 * split experts, floor((50 h + 50) / 100) go over the bus, the highest ids — with their plan numbers (brute_pair) and
 * the bits of the same pairs computed with every split expert on the host. */
static int split_to_host(const int32_t *re, int K, int t, int e) {
    int ids[8], h = 0;
    for (int j = 0; j < K; j++) {
        const int x = re[t * K + j];
        int seen = x % 3 == 1;
        for (int q = 0; q < h; q++) seen |= ids[q] == x;
        if (!seen) ids[h++] = x;
    }
    int above = 0;
    for (int q = 0; q < h; q++) above += ids[q] > e;
    return above >= (50 * h + 50) / 100;
}

static void split_rows_are_the_hosts_pairs(void **state) {
    fixture *f = *state;
    dsv4_model *m = f->m;
    const int d = m->cfg.dim, E = m->cfg.n_routed, K = m->cfg.n_act, L = m->cfg.n_layers - 1;
    int32_t re[T * 3], pair[T * 3], pair_all[T * 3];
    float rw[T * 3], *xn = malloc(sizeof(float) * T * d), *rows = malloc(sizeof(float) * T * K * d),
                     *rows_all = malloc(sizeof(float) * T * K * d);
    for (int i = 0; i < T * d; i++) xn[i] = rnd_float();
    make_routing(E, K, re, rw);
    uint8_t split[8], all[8];
    for (int e = 0; e < E; e++) {
        split[e] = e % 3 == 1 ? EXPERT_ON_GPU : EXPERT_ON_SPLIT;
        all[e] = e % 3 == 1 ? EXPERT_ON_GPU : EXPERT_ON_HOST;
    }
    moe_host_scratch scr;
    assert_int_equal(moe_host_scratch_init(&scr, &m->cfg, T), 0);
    const int n = moe_host_rows(m, &m->layers[L], split, 50, xn, re, rw, T, &scr, rows, pair);
    const int n_all = moe_host_rows(m, &m->layers[L], all, 50, xn, re, rw, T, &scr, rows_all, pair_all);
    int i = 0, on_bus = 0;
    for (int a = 0; a < n_all; a++) {   /* the all-host rows in order: experts, then tokens */
        int t = -1, e = -1;
        for (int u = 0; u < T && t < 0; u++)
            for (int x = 0; x < E; x++)
                if (all[x] && routes_to(re, K, u, x) && brute_pair(re, K, u, x) == pair_all[a]) t = u, e = x;
        assert_true(t >= 0);
        if (!split_to_host(re, K, t, e)) {
            on_bus++;
            continue;
        }
        assert_true(i < n);
        assert_int_equal(pair[i], pair_all[a]);
        assert_memory_equal(rows + (size_t)i * d, rows_all + (size_t)a * d, sizeof(float) * d);
        i++;
    }
    assert_int_equal(i, n);
    assert_true(on_bus > 0 && n > 0);   /* both sides have pairs: the routing exercises the rule */
    /* at 0 % the host has every pair, at 100 % none */
    assert_int_equal(moe_host_rows(m, &m->layers[L], split, 0, xn, re, rw, T, &scr, rows, pair), n_all);
    assert_int_equal(moe_host_rows(m, &m->layers[L], split, 100, xn, re, rw, T, &scr, rows, pair), 0);
    moe_host_scratch_free(&scr);
    free(xn);
    free(rows);
    free(rows_all);
}

/* moe_forward routes by itself: take its routing from the workspace, then rebuild its output from host rows. */
static void rows_combine_to_moe_forward(void **state) {
    fixture *f = *state;
    dsv4_model *m = f->m;
    const int d = m->cfg.dim, E = m->cfg.n_routed, K = m->cfg.n_act, L = m->cfg.n_layers - 1;
    /* one real step so that the workspace exists, then the MoE alone on chosen rows */
    int32_t toks[T];
    tm_tokens(toks, T, m->cfg.vocab_size, 5);
    free(tm_logits(m, toks, T, NULL, 0));
    dsv4_workspace *ws = m->ws;
    ws->batch.T = T;
    float *xn = malloc(sizeof(float) * T * d), *want = malloc(sizeof(float) * T * d);
    for (int i = 0; i < T * d; i++) xn[i] = ws->xn[i] = rnd_float();
    moe_forward(m, &m->layers[L], ws);
    memcpy(want, ws->sub, sizeof(float) * T * d);
    int32_t re[T * 3], pair[T * 3];
    float rw[T * 3];
    memcpy(re, ws->route_e, sizeof re);
    memcpy(rw, ws->route_w, sizeof rw);
    /* the shared expert's rows, through the same expert code: a layer copy whose expert 0 is the shared expert,
     * every token routed to it alone with weight 1 (x * 1.0f == x: moe_forward applies no weight there) */
    dsv4_layer shared_as_routed = m->layers[L];
    dsv4_weight w1 = m->layers[L].sw1, w2 = m->layers[L].sw2, w3 = m->layers[L].sw3;
    shared_as_routed.w1 = &w1;
    shared_as_routed.w2 = &w2;
    shared_as_routed.w3 = &w3;
    shared_as_routed.route_counts = NULL;
    int32_t re0[T * 3];
    float rw0[T * 3];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) { re0[t * K + j] = 0; rw0[t * K + j] = 1.0f; }   /* weight 1 = no weight */
    const uint8_t all[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    moe_host_scratch scr;
    assert_int_equal(moe_host_scratch_init(&scr, &m->cfg, T), 0);
    float *rows = malloc(sizeof(float) * T * K * d), *shared = malloc(sizeof(float) * T * d);
    int32_t spair[T * 3];
    assert_int_equal(moe_host_rows(m, &shared_as_routed, all, 0, xn, re0, rw0, T, &scr, shared, spair), T);
    const int n = moe_host_rows(m, &m->layers[L], all, 0, xn, re, rw, T, &scr, rows, pair);
    /* row of pair p: rows are packed in pair order when every expert is on the host */
    for (int i = 0; i < n; i++) assert_int_equal(pair[i], i);
    for (int t = 0; t < T; t++) {
        float acc[4096];
        memset(acc, 0, sizeof(float) * d);
        for (int e = 0; e < E; e++) {
            if (!routes_to(re, K, t, e)) continue;
            const float *y = rows + (size_t)brute_pair(re, K, t, e) * d;
            for (int k = 0; k < d; k++) acc[k] += y[k];
        }
        for (int k = 0; k < d; k++) acc[k] = num_bf16_1(m->mode, acc[k] + shared[(size_t)t * d + k]);
        if (memcmp(acc, want + (size_t)t * d, sizeof(float) * d)) fail_msg("token %d: host rows + combine != moe_forward", t);
    }
    moe_host_scratch_free(&scr);
    free(rows);
    free(shared);
    free(xn);
    free(want);
}

int main(void) {
    const struct CMUnitTest exact[] = {
        cmocka_unit_test(numbering_and_invariance),
        cmocka_unit_test(split_rows_are_the_hosts_pairs),
        cmocka_unit_test(rows_combine_to_moe_forward),
    };
    const struct CMUnitTest official[] = {
        cmocka_unit_test(numbering_and_invariance),
        cmocka_unit_test(split_rows_are_the_hosts_pairs),
        cmocka_unit_test(rows_combine_to_moe_forward),
    };
    return cmocka_run_group_tests_name("host experts, exact", exact, setup_exact, teardown) |
           cmocka_run_group_tests_name("host experts, official", official, setup_official, teardown);
}
