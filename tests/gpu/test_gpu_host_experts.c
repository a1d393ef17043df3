/* Routed experts in host memory (issue 15) on the GPU. A tiny checkpoint loaded with a GPU budget that holds every
 * other weight and about half of the routed experts keeps the rest in host memory, computed by the CPU:
 *   - the split model is exact with itself (memcmp against its own one-shot run): token by token, random chunks,
 *     batched beside a second stream, speculative steps rolled back, saved and restored at 5 / 10 / 131;
 *   - it agrees with the all-GPU model within the per-kernel tolerance (the CPU's and GPU's expert kernels sum in
 *     different orders): the deviation is printed and bounded (EXACT 1e-4, OFFICIAL 5e-2 of the largest logit);
 *   - a state saved on the split model continues on the all-GPU model and the other way round (within the same
 *     tolerance: the state format does not depend on where experts live);
 *   - placement: the host expert count equals the CPU placement of model/expert_place.h for the same budget, with
 *     and without a routing profile (a profile counted on the GPU by `dsv4 profile`'s route counters);
 *   - a damaged profile, a budget below the other weights: one-line errors, nothing left allocated.
 *   - the host experts read from the file mapping (DSV4_WEIGHT_MEMORY=map, populate) give the same bits as from
 *     their default copy on huge pages;
 *   - steps enqueued ahead (DSV4_CUDA_HX_AHEAD=1, the fixture's split model; cuda_host_experts.h): its one-token and
 *     chunk steps (graphed, every hand-off a pair of kernels) against its one-shot step (launched directly) by memcmp
 *     in the parity runs (at least its one-token steps counted as enqueued ahead); DSV4_CUDA_HX_AHEAD=0 token by token
 *     the same bits, nothing graphed or enqueued ahead; graphs off, every one-token step enqueued ahead launched
 *     directly, the same bits; a host turn failed on purpose mid-step returns its line, releases the GPU, and the
 *     model goes on;
 *   - the bus share (`--bus-share`): with half the host experts read by the GPU over the bus, all of the above; with
 *     every host expert on the bus, the split model's logits are the all-GPU model's bit for bit (the same kernels
 *     on the same bytes, read from page-locked host memory);
 *   - the token split (`--bus-by-token`, model/expert_split.h): with each token's host routes split between the host
 *     and the GPU over the bus, all of the above; at a share of 1 every pair is the GPU's (the all-GPU model's bits,
 *     the host reading nothing), at 0.01 every pair is the host's (the bits of the split without the bus).
 * Both numeric modes, f32 and fp8 KV. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "against.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/pool.h"
#include "model/expert_place.h"
#include "model/expert_profile.h"
#include "model/footprint.h"
#include "model/fp4_planes.h"
#include "model/model.h"
#include "model/route_count.h"
#include "backend/cuda/cuda_backend.h"

#define SEQ_LEN 200

typedef struct {
    const char *name, *preset;
    const char *sets[4];
    int n_sets;
    dsv4_mode mode;
    int kv;
    double tol;          /* max |split - all-GPU| / max |all-GPU| over every logit */
    double bus;          /* dsv4_load_opts.bus_share of the split model (-1: none) */
    int by_token;        /* dsv4_load_opts.bus_by_token */
} topology;

static const topology topologies[] = {
    {"EXACT flash-like", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_EXACT, DSV4_KV_F32, 1e-4, -1},
    {"OFFICIAL flash-like", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_F32, 5e-2, -1},
    {"OFFICIAL pro-like, fp8 KV", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_FP8, 5e-2, -1},
    {"OFFICIAL flash-like, half the host experts over the bus", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_BF16, 5e-2, 0.5},
    {"EXACT pro-like, half the host experts over the bus", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3, DSV4_MODE_EXACT, DSV4_KV_F32, 1e-4, 0.5},
    {"OFFICIAL flash-like, each token's host routes split at 50 %", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_F32, 5e-2, 0.5, 1},
    {"EXACT pro-like, fp8 KV, each token's host routes split at 35 %", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3, DSV4_MODE_EXACT, DSV4_KV_FP8, 1e-4, 0.35, 1},
};
#define N_TOPO (int)(sizeof topologies / sizeof topologies[0])

typedef struct {
    const topology *tp;
    dsv4_model *gpu, *split;   /* all on the GPU; about half the routed experts on the host */
    double gpu_mem_gb;
    char dir[256];
    int vocab;
    int32_t tok[SEQ_LEN], other[SEQ_LEN];
    float *ref, *ref_other;    /* the split model's one-shot logits */
    float *gref;               /* the all-GPU model's */
} fixture;

static dsv4_model *load_split_by(const char *dir, const topology *tp, double gb, const char *profile, double bus, int by_token,
                                 dsv4_error *err) {
    dsv4_load_opts lo = { .mode = tp->mode, .quiet = 1, .device = DSV4_DEVICE_CUDA, .kv_format = tp->kv, .gpu_mem_gb = gb,
                          .expert_profile = profile ? profile : "", .bus_share = bus, .bus_by_token = by_token };
    dsv4_model *m = NULL;
    return dsv4_model_load(dir, &lo, &m, err) ? NULL : m;
}

static dsv4_model *load_split_bus(const char *dir, const topology *tp, double gb, const char *profile, double bus, dsv4_error *err) {
    return load_split_by(dir, tp, gb, profile, bus, 0, err);
}

static dsv4_model *load_split(const char *dir, const topology *tp, double gb, const char *profile, dsv4_error *err) {
    return load_split_by(dir, tp, gb, profile, tp->bus, tp->by_token, err);
}

/* The budget that holds every other weight and half of the routed experts, and that placement's host count (and,
 * split at bus_pct, its bus count, when n_bus is not NULL). */
static double half_budget_bus(dsv4_model *m, const uint64_t *counts, int64_t *n_host, int bus_pct, int64_t *n_bus) {
    expert_map map;
    uint64_t fixed, one;
    dsv4_error err;
    if (expert_map_for_budget(m, UINT64_MAX / 2, NULL, &map, &fixed, &one, &err)) return -1;
    expert_map_free(&map);
    const int64_t half = (int64_t)m->cfg.n_layers * m->cfg.n_routed / 2;
    const double gb = (double)(fixed + (uint64_t)half * one + one / 2) / 1073741824.0;
    if (expert_map_for_budget(m, (uint64_t)(gb * 1073741824.0), counts, &map, &fixed, &one, &err)) return -1;
    *n_host = map.n_host;
    expert_map_split_bus(&map, bus_pct, 0, NULL, 0);
    if (n_bus) *n_bus = map.n_bus;
    expert_map_free(&map);
    return gb;
}

static double half_budget(dsv4_model *m, const uint64_t *counts, int64_t *n_host) { return half_budget_bus(m, counts, n_host, 0, NULL); }

static int setup(void **state, const topology *tp) {
    fixture *f = calloc(1, sizeof *f);
    f->tp = tp;
    f->gpu = tm_make_on(tp->preset, tp->sets, tp->n_sets, 4321, tp->mode, DSV4_DEVICE_CUDA, tp->kv, f->dir);
    if (!f->gpu) return -1;
    int64_t n_host = 0, n_bus = 0;
    f->gpu_mem_gb = half_budget_bus(f->gpu, NULL, &n_host, tp->bus > 0 && !tp->by_token ? (int)(tp->bus * 100 + 0.5) : 0, &n_bus);
    dsv4_error err;
    /* the fixture's split model enqueues its small steps ahead whatever the default (DSV4_CUDA_HX_AHEAD) */
    setenv("DSV4_CUDA_HX_AHEAD", "1", 1);
    f->split = load_split(f->dir, tp, f->gpu_mem_gb, NULL, &err);
    unsetenv("DSV4_CUDA_HX_AHEAD");
    if (!f->split) { fprintf(stderr, "split load: %s\n", err.msg); return -1; }
    if (cuda_host_experts(f->split, NULL) != n_host || n_host <= 0 || cuda_bus_experts(f->split) != n_bus ||
        (tp->bus > 0 && !tp->by_token && (n_bus <= 0 || n_bus >= n_host)) || cuda_split_experts(f->split) != (tp->by_token ? n_host : 0)) {
        fprintf(stderr, "%lld experts on the host (%lld over the bus, %lld split by token), the placement says %lld (%lld)\n",
                (long long)cuda_host_experts(f->split, NULL), (long long)cuda_bus_experts(f->split),
                (long long)cuda_split_experts(f->split), (long long)n_host, (long long)n_bus);
        return -1;
    }
    dsv4_model_info info;
    dsv4_model_get_info(f->gpu, &info);
    f->vocab = info.vocab_size;
    tm_tokens(f->tok, SEQ_LEN, f->vocab, 17);
    tm_tokens(f->other, SEQ_LEN, f->vocab, 23);
    f->ref = tm_logits(f->split, f->tok, SEQ_LEN, NULL, 0);
    f->ref_other = tm_logits(f->split, f->other, SEQ_LEN, NULL, 0);
    f->gref = tm_logits(f->gpu, f->tok, SEQ_LEN, NULL, 0);
    if (!f->ref || !f->ref_other || !f->gref) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    free(f->ref);
    free(f->ref_other);
    free(f->gref);
    dsv4_model_free(f->split);
    dsv4_model_free(f->gpu);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

static double deviation(const float *a, const float *b, size_t n) {
    double dmax = 0, bmax = 0;
    for (size_t i = 0; i < n; i++) {
        dmax = fmax(dmax, fabs((double)a[i] - b[i]));
        bmax = fmax(bmax, fabs((double)b[i]));
    }
    return bmax > 0 ? dmax / bmax : dmax;
}

/* A split model loaded with DSV4_CUDA_HX_AHEAD=ahead and CUDA graphs on or off, run token by token: the fixture's
 * one-shot reference bits, no step graphed, and every step enqueued ahead when want_ahead (and the model has host
 * hand-offs), none otherwise. */
static void split_token_by_token(const fixture *f, const char *ahead, int graphs, int want_ahead) {
    dsv4_error lerr;
    setenv("DSV4_CUDA_HX_AHEAD", ahead, 1);
    dsv4_model *m = load_split(f->dir, f->tp, f->gpu_mem_gb, NULL, &lerr);
    unsetenv("DSV4_CUDA_HX_AHEAD");
    if (!m) fail_msg("split load, DSV4_CUDA_HX_AHEAD=%s: %s", ahead, lerr.msg);
    cuda_graphs_set(m, graphs, 0);
    float *got = malloc(sizeof(float) * SEQ_LEN * (size_t)f->vocab);
    dsv4_seq *q;
    if (!got || dsv4_seq_new(m, &q, &lerr)) fail_msg("DSV4_CUDA_HX_AHEAD=%s: %s", ahead, got ? lerr.msg : "out of memory");
    for (int p = 0; p < SEQ_LEN; p++) against_step1(m, q, f->tok + p, 1, got + (size_t)p * f->vocab);
    if (memcmp(got, f->ref, sizeof(float) * SEQ_LEN * (size_t)f->vocab))
        fail_msg("DSV4_CUDA_HX_AHEAD=%s, graphs %s, token by token: the logits differ from the one-shot reference", ahead,
                 graphs ? "on" : "off");
    cuda_graph_info g;
    cuda_host_work hw;
    cuda_graphs_get(m, &g);
    cuda_host_experts(m, &hw);
    const long want = want_ahead && cuda_host_experts(m, NULL) > cuda_bus_experts(m) ? SEQ_LEN : 0;   /* host hand-offs */
    if (g.graphed_steps != 0 || hw.ahead_steps != want)
        fail_msg("DSV4_CUDA_HX_AHEAD=%s, graphs %s: %ld steps graphed, %ld enqueued ahead (want 0 and %ld)", ahead, graphs ? "on" : "off",
                 g.graphed_steps, hw.ahead_steps, want);
    dsv4_seq_free(q);
    free(got);
    dsv4_model_free(m);
}

static void split_parity(void **state) {
    fixture *f = *state;
    const against a = { "host experts", f->split, f->vocab, SEQ_LEN, f->tok, f->other, f->ref, f->ref_other };
    against_one_shot_and_chunks(&a);
    against_batched(&a);
    against_save_across(&a, f->split, f->split, "saved and restored with host experts");
    against_rollback(&a);
    cuda_host_work w;
    const int64_t n_host = cuda_host_experts(f->split, &w);
    const double dev = deviation(f->ref, f->gref, (size_t)SEQ_LEN * f->vocab);
    printf("  %lld experts on the host, %lld of them over the bus (--gpu-mem %.4f GiB); host computing %.1f ms, waiting %.1f ms, "
           "%llu weight bytes read; max |split - all-GPU| / max |all-GPU| = %.3g\n", (long long)n_host,
           (long long)cuda_bus_experts(f->split), f->gpu_mem_gb, w.host_ms, w.wait_ms, (unsigned long long)w.host_bytes, dev);
    /* the host's reads: whole experts (every routed expert of the main layers has one size), some of them */
    const uint64_t eb = dsv4_expert_weight_bytes(&f->split->layers[f->split->cfg.n_layers - 1], 0);
    if (n_host > cuda_bus_experts(f->split) && (w.host_bytes == 0 || w.host_bytes % eb))
        fail_msg("the host's expert reads, %llu bytes, are not a positive number of %llu-byte experts", (unsigned long long)w.host_bytes,
                 (unsigned long long)eb);
    /* the fixture enqueues its small steps ahead (token by token, the chunks, the batched and rollback steps) */
    if (n_host > cuda_bus_experts(f->split) && w.ahead_steps < SEQ_LEN)
        fail_msg("the split model enqueued %ld steps ahead, fewer than its %d one-token steps", w.ahead_steps, SEQ_LEN);
    const topology *tp = f->tp;
    if (dev > tp->tol) fail_msg("the split model deviates %.3g from the all-GPU one (tolerance %.3g)", dev, tp->tol);
    /* the host experts read from the file mapping (populated or not) instead of their copy on huge pages: the
     * same bits (DSV4_WEIGHT_MEMORY; the fixture's split model took the default, the copy) */
    const char *const kinds[] = {"map", "populate"};
    for (int k = 0; k < 2; k++) {
        dsv4_error lerr;
        setenv("DSV4_WEIGHT_MEMORY", kinds[k], 1);
        dsv4_model *m = load_split(f->dir, tp, f->gpu_mem_gb, NULL, &lerr);
        unsetenv("DSV4_WEIGHT_MEMORY");
        if (!m) fail_msg("split load, DSV4_WEIGHT_MEMORY=%s: %s", kinds[k], lerr.msg);
        float *got = tm_logits(m, f->tok, SEQ_LEN, NULL, 0);
        if (!got || memcmp(got, f->ref, sizeof(float) * SEQ_LEN * (size_t)f->vocab))
            fail_msg("host experts in the file mapping (%s) differ from their copy", kinds[k]);
        free(got);
        dsv4_model_free(m);
    }
    /* every host expert read by the GPU over the bus: the all-GPU model's bits */
    {
        dsv4_error lerr;
        dsv4_model *m = load_split_bus(f->dir, tp, f->gpu_mem_gb, NULL, 1.0, &lerr);
        if (!m) fail_msg("split load, every host expert on the bus: %s", lerr.msg);
        assert_int_equal(cuda_bus_experts(m), n_host);
        float *got = tm_logits(m, f->tok, SEQ_LEN, NULL, 0);
        if (!got || memcmp(got, f->gref, sizeof(float) * SEQ_LEN * (size_t)f->vocab))
            fail_msg("every host expert on the bus: the logits differ from the all-GPU model's");
        free(got);
        /* with no host work left its steps run as CUDA graphs; the split model's (host hand-offs) do when they are
         * small enough to enqueue ahead (the parity runs above: one token, chunks), else they are launched directly
         * (the fixture's one-shot reference of SEQ_LEN tokens) */
        cuda_graph_info bus_g, split_g;
        cuda_graphs_get(m, &bus_g);
        cuda_graphs_get(f->split, &split_g);
        if (bus_g.on && (bus_g.graphed_steps < 1 || bus_g.direct_steps != 0))
            fail_msg("every host expert on the bus: %ld steps graphed, %ld launched directly", bus_g.graphed_steps, bus_g.direct_steps);
        if (split_g.on && (split_g.graphed_steps < 1 || split_g.direct_steps < 1))
            fail_msg("the split model: %ld steps graphed (enqueued ahead), %ld launched directly", split_g.graphed_steps,
                     split_g.direct_steps);
        dsv4_model_free(m);
    }
    /* the token split's two ends: at a share of 1 every pair goes over the bus (the all-GPU model's bits, the host
     * reading no expert), at 0.01 none does (the bits of the split model without the bus: the host computes every
     * pair, and the GPU's tiles of split experts are all absent) */
    if (tp->by_token) {
        dsv4_error lerr;
        dsv4_model *all_bus = load_split_by(f->dir, tp, f->gpu_mem_gb, NULL, 1.0, 1, &lerr);
        if (!all_bus) fail_msg("split load, by token at 1: %s", lerr.msg);
        float *got = tm_logits(all_bus, f->tok, SEQ_LEN, NULL, 0);
        cuda_host_work aw;
        cuda_host_experts(all_bus, &aw);
        if (!got || memcmp(got, f->gref, sizeof(float) * SEQ_LEN * (size_t)f->vocab))
            fail_msg("split by token at 1: the logits differ from the all-GPU model's");
        if (aw.host_bytes) fail_msg("split by token at 1: the host read %llu expert bytes", (unsigned long long)aw.host_bytes);
        free(got);
        dsv4_model_free(all_bus);
        dsv4_model *no_bus = load_split_bus(f->dir, tp, f->gpu_mem_gb, NULL, -1, &lerr);
        dsv4_model *all_host = no_bus ? load_split_by(f->dir, tp, f->gpu_mem_gb, NULL, 0.01, 1, &lerr) : NULL;
        if (!all_host) fail_msg("split load, by token at 0.01 or without the bus: %s", lerr.msg);
        float *want = tm_logits(no_bus, f->tok, SEQ_LEN, NULL, 0);
        got = tm_logits(all_host, f->tok, SEQ_LEN, NULL, 0);
        if (!want || !got || memcmp(got, want, sizeof(float) * SEQ_LEN * (size_t)f->vocab))
            fail_msg("split by token at 0.01: the logits differ from the split model's without the bus");
        /* and where the two ends differ (the CPU's and the GPU's expert kernels give different bits: EXACT here;
         * in OFFICIAL mode the tiny models' rows agree to the bit, run 188), the fixture's share mixes them: its
         * logits are neither end's */
        const size_t nb = sizeof(float) * SEQ_LEN * (size_t)f->vocab;
        if (memcmp(want, f->gref, nb) && (!memcmp(f->ref, want, nb) || !memcmp(f->ref, f->gref, nb)))
            fail_msg("split by token at %.2f: the logits equal one end's, so no pair went the other way", tp->bus);
        free(want);
        free(got);
        dsv4_model_free(all_host);
        dsv4_model_free(no_bus);
    }
    /* the host's FP4 experts in nibble planes (model/fp4_planes.h), on by default: where the host's kernels read
     * them (the pair order on an AVX-512 set: OFFICIAL here) the fixture's split model holds its host arena's experts
     * in planes, elsewhere none; loaded with DSV4_CPU_FP4_PLANES=0, none, and the same bits as the fixture's, one-shot
     * (tens of tokens an expert: the tile path) and token by token (the fused path) */
    {
        dsv4_error lerr;
        setenv("DSV4_CPU_FP4_PLANES", "0", 1);
        dsv4_model *pm = load_split(f->dir, tp, f->gpu_mem_gb, NULL, &lerr);
        unsetenv("DSV4_CPU_FP4_PLANES");
        if (!pm) fail_msg("split load with DSV4_CPU_FP4_PLANES=0: %s", lerr.msg);
        const long planes = fp4_planes_routed(f->split), off = fp4_planes_routed(pm);
        /* (split by token, every host expert is in the bus arena, which keeps the checkpoint's layout) */
        const int want = tp->mode == DSV4_MODE_OFFICIAL && !tp->by_token && !strncmp(dsv4_pool_kernels(pm->pool)->name, "avx512", 6);
        if (want != (planes > 0) || off)
            fail_msg("%ld host expert weights in planes by default, %ld with DSV4_CPU_FP4_PLANES=0 (%s kernels)", planes, off,
                     dsv4_pool_kernels(pm->pool)->name);
        static const int one[] = { 1 };
        const size_t nb = sizeof(float) * SEQ_LEN * (size_t)f->vocab;
        float *got = tm_logits(pm, f->tok, SEQ_LEN, NULL, 0), *got1 = tm_logits(pm, f->tok, SEQ_LEN, one, 1);
        if (!got || !got1 || memcmp(got, f->ref, nb) || memcmp(got1, f->ref, nb))
            fail_msg("DSV4_CPU_FP4_PLANES=0: the logits differ from the split model's (%ld expert weights in planes)", planes);
        fprintf(stderr, "  %s: %ld host expert weights in nibble planes by default, the bits of the checkpoint's layout\n", tp->name, planes);
        free(got);
        free(got1);
        dsv4_model_free(pm);
    }
    /* DSV4_CUDA_HX_AHEAD=0: every step with host work launched directly, the host answering each layer before the
     * next is launched; token by token, the bits of the fixture's one-shot reference (and so of the steps enqueued
     * ahead, which split_parity held to it), nothing graphed or enqueued ahead */
    split_token_by_token(f, "0", 1, 0);
    /* graphs off: the steps enqueued ahead are launched directly, the server thread answering each hand-off while
     * this thread may still be launching; token by token, the reference's bits again, every step enqueued ahead and
     * none graphed */
    split_token_by_token(f, "1", 0, 1);
    /* a host turn that fails inside a step enqueued ahead (injected at its second hand-off): the step returns that
     * line, the layers the GPU was waiting on are released (the step does not hang), and the model goes on: a new
     * sequence gives the reference's bits */
    cuda_graph_info sg;
    cuda_graphs_get(f->split, &sg);
    if (sg.on) {
        dsv4_error lerr;
        dsv4_seq *q;
        float *got = malloc(sizeof(float) * 8 * (size_t)f->vocab);
        if (!got || dsv4_seq_new(f->split, &q, &lerr)) fail_msg("failed host turn: %s", got ? lerr.msg : "out of memory");
        against_step1(f->split, q, f->tok, 4, got);
        cuda_hx_fail_next(f->split, 1);
        dsv4_step_item it = { q, f->tok + 4, 1, DSV4_LOGITS_ALL, got };
        if (!dsv4_step(f->split, &it, 1, &lerr)) fail_msg("a step whose host turn failed returned success");
        if (!strstr(lerr.msg, "injected failure")) fail_msg("a failed host turn: unexpected error \"%s\"", lerr.msg);
        dsv4_seq_free(q);
        if (dsv4_seq_new(f->split, &q, &lerr)) fail_msg("after a failed host turn: %s", lerr.msg);
        against_step1(f->split, q, f->tok, 4, got);
        against_step1(f->split, q, f->tok + 4, 4, got + (size_t)4 * f->vocab);
        if (memcmp(got, f->ref, sizeof(float) * 8 * (size_t)f->vocab))
            fail_msg("after a failed host turn: the next sequence's logits differ from the reference");
        dsv4_seq_free(q);
        free(got);
    }
    /* states cross between the two placements: continued elsewhere, within the same tolerance */
    dsv4_error err;
    float *l = malloc(sizeof(float) * SEQ_LEN * (size_t)f->vocab);
    for (int dir = 0; dir < 2; dir++) {
        dsv4_model *from = dir ? f->gpu : f->split, *to = dir ? f->split : f->gpu;
        dsv4_seq *s, *r;
        void *buf;
        size_t len;
        if (dsv4_seq_new(from, &s, &err)) fail_msg("%s", err.msg);
        against_step1(from, s, f->tok, 131, l);
        if (dsv4_seq_save_mem(s, &buf, &len, &err) || dsv4_seq_load_mem(to, buf, len, &r, &err)) fail_msg("%s", err.msg);
        against_step1(to, r, f->tok + 131, SEQ_LEN - 131, l + (size_t)131 * f->vocab);
        const double d = deviation(l + (size_t)131 * f->vocab, f->gref + (size_t)131 * f->vocab, (size_t)(SEQ_LEN - 131) * f->vocab);
        if (d > tp->tol) fail_msg("saved on %s, continued on %s: deviation %.3g", dir ? "all-GPU" : "split", dir ? "split" : "all-GPU", d);
        dsv4_seq_free(s);
        dsv4_seq_free(r);
        free(buf);
    }
    free(l);
}

#define SETUP(i) static int setup_##i(void **s) { return setup(s, &topologies[i]); }
SETUP(0) SETUP(1) SETUP(2) SETUP(3) SETUP(4) SETUP(5) SETUP(6)

/* A profile counted on the GPU places the most used experts on it, as the CPU placement says; a damaged profile
 * and a budget below the other weights are one-line errors that leave nothing allocated. */
static void profile_and_errors(void **state) {
    (void)state;
    const topology *tp = &topologies[0];
    char dir[256], path[300];
    dsv4_model *gpu = tm_make_on(tp->preset, tp->sets, tp->n_sets, 77, tp->mode, DSV4_DEVICE_CUDA, tp->kv, dir);
    assert_non_null(gpu);
    dsv4_error err;
    int32_t tok[64];
    tm_tokens(tok, 64, gpu->cfg.vocab_size, 9);
    if (model_count_routes(gpu, 1, &err)) fail_msg("%s", err.msg);
    free(tm_logits(gpu, tok, 64, NULL, 0));
    expert_profile prof;
    if (model_route_profile(gpu, &prof, &err)) fail_msg("%s", err.msg);
    assert_int_equal(prof.tokens, 64);
    for (int l = 0; l < prof.n_layers; l++) {
        uint64_t sum = 0;
        for (int e = 0; e < prof.n_routed; e++) sum += prof.counts[(size_t)l * prof.n_routed + e];
        assert_int_equal(sum, 64 * (uint64_t)gpu->cfg.n_act);
    }
    snprintf(path, sizeof path, "%s/%s", dir, EXPERT_PROFILE_FILE);
    if (expert_profile_save(&prof, path, &err)) fail_msg("%s", err.msg);
    int64_t n_host = 0;
    const double gb = half_budget(gpu, prof.counts, &n_host);
    expert_profile_free(&prof);
    dsv4_model_free(gpu);
    dsv4_model *split = load_split(dir, tp, gb, path, &err);
    if (!split) fail_msg("load with the profile: %s", err.msg);
    assert_int_equal(cuda_host_experts(split, NULL), n_host);
    dsv4_model_free(split);
    /* damaged: a cut file */
    FILE *fp = fopen(path, "w");
    fputs("{\"dsv4_expert_profile\":1,", fp);
    fclose(fp);
    if (load_split(dir, tp, gb, path, &err)) fail_msg("a damaged profile loaded");
    if (!strstr(err.msg, "expert_profile.json") || strchr(err.msg, '\n')) fail_msg("unclear error: %s", err.msg);
    /* a budget below the other weights, then a good load (nothing left behind) */
    if (load_split(dir, tp, 1e-6, "", &err)) fail_msg("a budget below the other weights loaded");
    if (!strstr(err.msg, "the weights other than the routed experts need")) fail_msg("unclear error: %s", err.msg);
    if (!(split = load_split(dir, tp, gb, "", &err))) fail_msg("a good load after the errors failed: %s", err.msg);
    dsv4_model_free(split);
    tm_rmdir(dir);
}

int main(void) {
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu host experts: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    int (*setups[])(void **) = { setup_0, setup_1, setup_2, setup_3, setup_4, setup_5, setup_6 };
    struct CMUnitTest tests[N_TOPO + 1];
    for (int i = 0; i < N_TOPO; i++) tests[i] = (struct CMUnitTest){ topologies[i].name, split_parity, setups[i], teardown, NULL };
    tests[N_TOPO] = (struct CMUnitTest){ "profile placement and errors", profile_and_errors, NULL, NULL, NULL };
    return _cmocka_run_group_tests("gpu host experts (memcmp with itself, tolerance against all-GPU)", tests, N_TOPO + 1, NULL, NULL);
}
