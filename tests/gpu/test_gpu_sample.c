/* Sampling on the GPU (issue 11: "only token ids, and logits where asked for, come back to the host").
 *   - The kernel (cu_sample) against the CPU's definition (core/sample.c sample_row) on the same logits bits: the
 *     same token, for greedy and temperature with every filter and their combinations, over many rows and draw
 *     numbers, at the real vocabulary size and at small and odd sizes, with ties, -inf, NaN, peaked and flat
 *     rows, and n_allowed.
 *   - Batch invariance: a request alone, among 300 others at any position, and on a second run: the same token.
 *   - dsv4_step on a cuda model: the token drawn in the step equals sample_row on the logits row the same step
 *     returns (so: GPU-sampled == host-sampled of the GPU's logits), for items that want no logits, the last row
 *     or every row, in batches of more than one head pass (> CU_HEAD_ROWS rows).
 *   - The scheduler on a cuda model: streams drawing inside the step == the same streams sampled on the host
 *     (a no-op logits hook forces the host path), token for token.
 * Cross-device token equality is not claimed (GPU and CPU logits differ by ~1e-6). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cu_runtime.h"
#include "core/sample.h"
#include "engine/scheduler.h"
#include "helpers/testmodel.h"
#include "model/tiny.h"

static dsv4_rng rng;

/* ---- logits rows ---------------------------------------------------------------------------------------------- */

enum { KIND_NORMAL, KIND_TIES, KIND_PEAKED, KIND_FLAT, KIND_SPECIALS, KIND_WIDE, N_KINDS };

/* Rows like a model's (normal logits, scale 2-5), with exact ties, a dominant token, all equal, -inf / NaN, or
 * a huge range (most w underflow to 0). */
static void make_row(float *l, int V, int kind) {
    const double scale = 2.0 + 3.0 * dsv4_rng_uniform(&rng);
    for (int i = 0; i < V; i++) {
        switch (kind) {
        case KIND_TIES: l[i] = (float)(int)(dsv4_rng_below(&rng, 12)) * 0.25f; break;
        case KIND_FLAT: l[i] = 1.5f; break;
        case KIND_WIDE: l[i] = (float)(dsv4_rng_normal(&rng) * 60.0); break;
        default: l[i] = (float)(dsv4_rng_normal(&rng) * scale); break;
        }
        if (kind == KIND_SPECIALS) {
            const uint32_t k = dsv4_rng_below(&rng, 20);
            if (k == 0) l[i] = -INFINITY;
            if (k == 1) l[i] = NAN;
        }
    }
    if (kind == KIND_PEAKED) l[dsv4_rng_below(&rng, (uint32_t)V)] += 25.0f;
}

static dsv4_sampling sp(float t, int k, float p, float minp, int allowed) {
    dsv4_sampling s = { .temperature = t, .top_k = k, .top_p = p, .min_p = minp, .n_allowed = allowed };
    return s;
}

/* Every filter alone and combined, at several temperatures, greedy, and n_allowed. */
static const dsv4_sampling *param_sets(int V, int *n) {
    static dsv4_sampling s[20];
    int k = 0;
    s[k++] = sp(0, 0, 1, 0, 0);
    s[k++] = sp(1.0f, 0, 1, 0, 0);
    s[k++] = sp(0.3f, 0, 1, 0, 0);
    s[k++] = sp(1.7f, 0, 1, 0, 0);
    s[k++] = sp(1.0f, 1, 1, 0, 0);
    s[k++] = sp(0.8f, 2, 1, 0, 0);
    s[k++] = sp(0.8f, 40, 1, 0, 0);
    s[k++] = sp(1.0f, 1000, 1, 0, 0);
    s[k++] = sp(1.0f, 0, 0.5f, 0, 0);
    s[k++] = sp(0.7f, 0, 0.9f, 0, 0);
    s[k++] = sp(1.2f, 0, 0.99f, 0, 0);
    s[k++] = sp(1.0f, 0, 1, 0.05f, 0);
    s[k++] = sp(1.5f, 0, 1, 0.2f, 0);
    s[k++] = sp(0.8f, 50, 0.95f, 0, 0);
    s[k++] = sp(1.0f, 20, 0.9f, 0.02f, 0);
    s[k++] = sp(0.6f, 0, 0.8f, 0.1f, 0);
    s[k++] = sp(1.0f, 0, 0.9f, 0, V / 2);
    s[k++] = sp(0, 0, 1, 0, V / 3 + 1);
    s[k++] = sp(1e-6f, 0, 1, 0, 0);   /* the temperature floor 1e-5 */
    *n = k;
    return s;
}

static void *dev_copy(const void *h, size_t n) {
    void *d = cu_malloc(n);
    assert_non_null(d);
    assert_int_equal(cu_upload(d, h, n), 0);
    return d;
}

static void sync_ok(void) {
    dsv4_error err;
    if (cu_finish(NULL, "cu_sample", &err)) fail_msg("%s", err.msg);
}

/* Draw every request on the GPU in one launch; tok[n] on the host, and the distributions when probs != NULL. */
static void gpu_draw_probs(const float *d_logits, int V, const cu_sample_req *req, int n, int32_t *tok, float *probs) {
    cu_sample_req *d_req = dev_copy(req, sizeof *req * (size_t)n);
    float *d_w = cu_malloc(sizeof(float) * (size_t)n * (size_t)V);
    int32_t *d_tok = cu_malloc(sizeof(int32_t) * (size_t)n);
    float *d_p = probs ? cu_malloc(sizeof(float) * (size_t)n * (size_t)V) : NULL;
    assert_non_null(d_w);
    assert_non_null(d_tok);
    if (probs) assert_non_null(d_p);
    cu_sample(NULL, d_logits, V, d_req, n, d_w, d_tok, d_p);
    sync_ok();
    assert_int_equal(cu_download(tok, d_tok, sizeof(int32_t) * (size_t)n), 0);
    if (probs) assert_int_equal(cu_download(probs, d_p, sizeof(float) * (size_t)n * (size_t)V), 0);
    cu_free(d_req);
    cu_free(d_w);
    cu_free(d_tok);
    cu_free(d_p);
}
static void gpu_draw(const float *d_logits, int V, const cu_sample_req *req, int n, int32_t *tok) {
    gpu_draw_probs(d_logits, V, req, n, tok, NULL);
}

static cu_sample_req req_of(const dsv4_sampling *p, int row, uint64_t seed, uint64_t draw) {
    cu_sample_req r = { row, p->top_k, p->n_allowed, p->temperature, p->top_p, p->min_p, seed, draw };
    return r;
}

/* rows x param sets x draws requests on V tokens: GPU token == CPU token, request by request (and, with_probs,
 * the GPU's distribution == sample_distribution, bit for bit). */
static void kernel_vs_cpu(int V, int rows, int draws, int with_probs) {
    float *l = malloc(sizeof(float) * (size_t)rows * V);
    for (int r = 0; r < rows; r++) make_row(l + (int64_t)r * V, V, r % N_KINDS);
    int np;
    const dsv4_sampling *ps = param_sets(V, &np);
    const int n = rows * np * draws;
    cu_sample_req *req = malloc(sizeof *req * (size_t)n);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    for (int r = 0, q = 0; r < rows; r++)
        for (int k = 0; k < np; k++)
            for (int d = 0; d < draws; d++, q++) req[q] = req_of(&ps[k], r, 1000 + (uint64_t)k, (uint64_t)d * 7919 + (uint64_t)r);
    float *d_l = dev_copy(l, sizeof(float) * (size_t)rows * V);
    float *probs = with_probs ? malloc(sizeof(float) * (size_t)n * V) : NULL, *want_p = malloc(sizeof(float) * (size_t)V);
    gpu_draw_probs(d_l, V, req, n, tok, probs);
    sample_scratch sc;
    assert_int_equal(sample_scratch_init(&sc, V), 0);
    int mismatches = 0, prob_mismatches = 0;
    for (int q = 0; q < n; q++) {
        const cu_sample_req *r = &req[q];
        dsv4_sampling p = sp(r->temperature, r->top_k, r->top_p, r->min_p, r->n_allowed);
        p.seed = r->seed;
        const int32_t want = sample_row(&p, r->draw, l + (int64_t)r->row * V, &sc);
        if (tok[q] != want && mismatches++ < 10)
            printf("  V %d row %d (kind %d) T %g top-k %d top-p %g min-p %g allowed %d draw %llu: GPU %d, CPU %d\n", V, r->row,
                   r->row % N_KINDS, (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p, p.n_allowed,
                   (unsigned long long)r->draw, tok[q], want);
        if (probs && q % draws == 0) {   /* once per (row, parameters) */
            sample_distribution(&p, l + (int64_t)r->row * V, &sc, want_p);
            if (memcmp(want_p, probs + (int64_t)q * V, sizeof(float) * (size_t)V) && prob_mismatches++ < 5)
                printf("  V %d row %d T %g top-k %d top-p %g min-p %g: the GPU's distribution differs from the CPU's\n", V, r->row,
                       (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p);
        }
    }
    printf("  V %d: %d requests (%d rows x %d parameter sets x %d draws), %d token mismatches%s\n", V, n, rows, np, draws, mismatches,
           probs ? (prob_mismatches ? ", DISTRIBUTIONS DIFFER" : ", distributions bit-identical") : "");
    if (mismatches) fail_msg("V %d: %d of %d GPU draws differ from the CPU's", V, mismatches, n);
    if (prob_mismatches) fail_msg("V %d: %d GPU distributions differ from the CPU's", V, prob_mismatches);
    free(probs);
    free(want_p);
    sample_scratch_free(&sc);
    cu_free(d_l);
    free(l);
    free(req);
    free(tok);
}

static void kernel_matches_cpu_small_vocab(void **state) {
    (void)state;
    kernel_vs_cpu(7, 12, 40, 1);
    kernel_vs_cpu(1000, 12, 20, 1);
    kernel_vs_cpu(1025, 6, 10, 1);
    kernel_vs_cpu(5003, 6, 6, 1);
}

static void kernel_matches_cpu_full_vocab(void **state) {
    (void)state;
    kernel_vs_cpu(129280, 6, 2, 0);
}

/* A request gives the same token alone, at any place among many others, and run after run. */
static void kernel_is_batch_invariant(void **state) {
    (void)state;
    enum { V = 20000, ROWS = 6, N = 300 };
    float *l = malloc(sizeof(float) * ROWS * V);
    for (int r = 0; r < ROWS; r++) make_row(l + (int64_t)r * V, V, r % N_KINDS);
    float *d_l = dev_copy(l, sizeof(float) * ROWS * V);
    int np;
    const dsv4_sampling *ps = param_sets(V, &np);
    cu_sample_req *req = malloc(sizeof *req * N), *perm = malloc(sizeof *req * N);
    int32_t *a = malloc(sizeof(int32_t) * N), *b = malloc(sizeof(int32_t) * N), *c = malloc(sizeof(int32_t) * N);
    int *where = malloc(sizeof(int) * N);
    for (int q = 0; q < N; q++) req[q] = req_of(&ps[q % np], q % ROWS, 5 + (uint64_t)q % 3, (uint64_t)q);
    gpu_draw(d_l, V, req, N, a);
    /* a shuffled batch */
    for (int q = 0; q < N; q++) where[q] = q;
    for (int q = N - 1; q > 0; q--) {
        const int j = (int)dsv4_rng_below(&rng, (uint32_t)q + 1), t = where[q];
        where[q] = where[j];
        where[j] = t;
    }
    for (int q = 0; q < N; q++) perm[where[q]] = req[q];
    gpu_draw(d_l, V, perm, N, b);
    for (int q = 0; q < N; q++)
        if (b[where[q]] != a[q]) fail_msg("request %d: %d in order, %d shuffled", q, a[q], b[where[q]]);
    /* alone, a few of them */
    for (int q = 0; q < N; q += 37) {
        gpu_draw(d_l, V, &req[q], 1, c);
        if (c[0] != a[q]) fail_msg("request %d: %d in the batch, %d alone", q, a[q], c[0]);
    }
    /* again */
    gpu_draw(d_l, V, req, N, c);
    if (memcmp(a, c, sizeof(int32_t) * N)) fail_msg("a second run drew other tokens");
    printf("  %d requests: in order == shuffled == alone == second run\n", N);
    cu_free(d_l);
    free(l); free(req); free(perm); free(a); free(b); free(c); free(where);
}

/* ---- through dsv4_step on a cuda model -------------------------------------------------------------------------- */

static void step_draw_equals_host_draw_of_gpu_logits(void **state) {
    (void)state;
    char dir[256];
    const char *sets[] = { "compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3" };
    for (int mode = 0; mode < 2; mode++) {
        dsv4_model *m = tm_make_on("flash-tiny", sets, 3, 7, mode ? DSV4_MODE_OFFICIAL : DSV4_MODE_EXACT, DSV4_DEVICE_CUDA,
                                   DSV4_KV_F32, dir);
        assert_non_null(m);
        dsv4_model_info info;
        dsv4_model_get_info(m, &info);
        const int V = info.vocab_size;
        enum { S = 70, P = 6 };   /* 70 sampled rows: two passes of the head (CU_HEAD_ROWS = 64) */
        int np;
        const dsv4_sampling *ps = param_sets(V, &np);
        dsv4_sampling *par = malloc(sizeof *par * S);
        dsv4_seq *seq[S], *twin[S];
        dsv4_step_item it[S], tw[S];
        int32_t (*prompt)[P] = malloc(sizeof(int32_t) * S * P), got[S], got2[S];
        float *rows = malloc(sizeof(float) * (size_t)S * P * V);
        dsv4_error err;
        for (int i = 0; i < S; i++) {
            tm_tokens(prompt[i], P, V, 500 + (uint64_t)i);
            par[i] = ps[i % np];
            par[i].seed = 77 + (uint64_t)i;
            assert_int_equal(dsv4_seq_new(m, &seq[i], &err), 0);
            assert_int_equal(dsv4_seq_new(m, &twin[i], &err), 0);
        }
        for (int round = 0; round < 3; round++) {
            for (int i = 0; i < S; i++) {
                /* the twin gets the same tokens with its last row back, the item itself varies what it wants */
                const dsv4_logits_want w = (i + round) % 3 == 0 ? DSV4_LOGITS_NONE : (i + round) % 3 == 1 ? DSV4_LOGITS_LAST : DSV4_LOGITS_ALL;
                const int n = round == 0 ? P : 1;
                const int32_t *t = round == 0 ? prompt[i] : &got[i];
                it[i] = (dsv4_step_item){ seq[i], t, n, w, w == DSV4_LOGITS_NONE ? NULL : rows + (int64_t)i * P * V };
                it[i].sample = &par[i];
                it[i].draw = (uint64_t)round;
                it[i].token = &got2[i];
                tw[i] = (dsv4_step_item){ twin[i], t, n, DSV4_LOGITS_LAST, rows + (int64_t)i * P * V };
            }
            assert_int_equal(dsv4_step(m, tw, S, &err), 0);
            sample_scratch sc;
            assert_int_equal(sample_scratch_init(&sc, V), 0);
            int32_t host[S];
            for (int i = 0; i < S; i++) host[i] = sample_row(&par[i], (uint64_t)round, rows + (int64_t)i * P * V, &sc);
            float *last = malloc(sizeof(float) * (size_t)S * V);
            for (int i = 0; i < S; i++) memcpy(last + (int64_t)i * V, rows + (int64_t)i * P * V, sizeof(float) * (size_t)V);
            assert_int_equal(dsv4_step(m, it, S, &err), 0);
            for (int i = 0; i < S; i++) {
                if (got2[i] != host[i])
                    fail_msg("%s round %d item %d (want %d): drawn in the step %d, on the host from the GPU's row %d",
                             mode ? "OFFICIAL" : "EXACT", round, i, it[i].want, got2[i], host[i]);
                const float *mine = it[i].want == DSV4_LOGITS_ALL ? rows + ((int64_t)i * P + it[i].n_tokens - 1) * V
                                                                  : rows + (int64_t)i * P * V;
                if (it[i].want != DSV4_LOGITS_NONE && memcmp(mine, last + (int64_t)i * V, sizeof(float) * (size_t)V))
                    fail_msg("round %d item %d: the logits row that came back differs from the twin's", round, i);
                got[i] = got2[i];
            }
            free(last);
            sample_scratch_free(&sc);
        }
        printf("  %s: %d items x 3 steps: every token drawn on the GPU == the host's draw from the GPU's row\n",
               mode ? "OFFICIAL" : "EXACT", S);
        for (int i = 0; i < S; i++) {
            dsv4_seq_free(seq[i]);
            dsv4_seq_free(twin[i]);
        }
        free(par);
        free(prompt);
        free(rows);
        dsv4_model_free(m);
        tm_rmdir(dir);
    }
}

/* ---- the scheduler -------------------------------------------------------------------------------------------- */

static int no_op_hook(void *ctx, const int32_t *g, int n, float *logits, int vocab) { return 0; }
static void ignore(void *ctx, int64_t id, int index, int32_t token, const float *logits) {}

static void run_streams(dsv4_model *m, int hooked, int32_t out[8][16]) {
    dsv4_error err;
    dsv4_sched *s;
    dsv4_sched_opts o = { 4, 9 };
    assert_int_equal(dsv4_sched_new(m, &o, &s, &err), 0);
    dsv4_sched_set_observer(s, ignore, NULL);
    dsv4_sched_observer_needs_logits(s, 0);
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int np;
    const dsv4_sampling *ps = param_sets(info.vocab_size, &np);
    int64_t id[8];
    int32_t prompt[8][30];
    for (int i = 0; i < 8; i++) {
        tm_tokens(prompt[i], 4 + 3 * i, info.vocab_size, 700 + (uint64_t)i);
        dsv4_request r = { prompt[i], 4 + 3 * i, ps[(3 * i + 1) % np], 16, 0 };
        r.sampling.seed = 40 + (uint64_t)i;
        if (hooked) r.hook = (dsv4_logits_hook){ no_op_hook, NULL };
        assert_int_equal(dsv4_sched_add(s, &r, &id[i], &err), 0);
    }
    while (dsv4_sched_pending(s) > 0)
        if (dsv4_sched_step(s, &err)) fail_msg("step: %s", err.msg);
    for (int i = 0; i < 8; i++) {
        dsv4_req_result r;
        assert_int_equal(dsv4_sched_result(s, id[i], &r, &err), 0);
        assert_int_equal(r.n_tokens, 16);
        memcpy(out[i], r.tokens, sizeof(int32_t) * 16);
    }
    dsv4_sched_free(s);
}

static void scheduler_gpu_draws_equal_host_draws(void **state) {
    (void)state;
    char dir[256];
    const char *sets[] = { "compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3" };
    dsv4_model *m = tm_make_on("flash-tiny", sets, 3, 9, DSV4_MODE_EXACT, DSV4_DEVICE_CUDA, DSV4_KV_F32, dir);
    assert_non_null(m);
    int32_t a[8][16], b[8][16];
    run_streams(m, 0, a);
    run_streams(m, 1, b);
    for (int i = 0; i < 8; i++)
        if (memcmp(a[i], b[i], sizeof a[i])) fail_msg("stream %d: drawn on the GPU and on the host differ", i);
    printf("  8 streams x 16 tokens through the scheduler: GPU draws == host draws\n");
    dsv4_model_free(m);
    tm_rmdir(dir);
}

int main(void) {
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu sample: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    dsv4_rng_seed(&rng, 4242);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kernel_matches_cpu_small_vocab),
        cmocka_unit_test(kernel_matches_cpu_full_vocab),
        cmocka_unit_test(kernel_is_batch_invariant),
        cmocka_unit_test(step_draw_equals_host_draw_of_gpu_logits),
        cmocka_unit_test(scheduler_gpu_draws_equal_host_draws),
    };
    return cmocka_run_group_tests_name("gpu sampling vs the cpu sampler", tests, NULL, NULL);
}
