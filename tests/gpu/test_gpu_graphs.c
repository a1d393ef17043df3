/* CUDA graphs (issue 18, "host overhead"): a cuda model's steps run as captured graphs by default
 * (src/backend/cuda/cu_graph.h) and as direct launches with DSV4_CUDA_GRAPHS=0 or cuda_graphs_set(m, 0, 0). Both
 * run the same kernels in the same order on one stream, so one script of steps gives the same bytes either way
 * (memcmp of every logits row, hidden row and drawn token):
 *   - prefill in random chunks of 1 .. 40 tokens to 300 positions (the indexer's rows, idx_rows, and the
 *     ratio-128 rows grow between steps: grids, arguments and the attention's shared memory change every few
 *     steps, and the indexer's scoring kernel appears once there are more rows than top-k);
 *   - a 150-token one-shot step (every row's logits: three passes of the head, the first inside the graph), then
 *     150 one-token decode steps with hidden rows;
 *   - three sequences at positions 10, 70 and 200 decoding together for 40 steps: 1 + 1 + 2 tokens, one drawing
 *     a token on the GPU (cu_sample inside the graph), one wanting every row.
 * The graphs must really have run (the counters: every step of the "on" run as graphs, graphs instantiated and
 * updated; none in the "off" run), the check must be able to fail (with one kernel removed from every captured
 * graph the bytes differ), graphs work again afterwards, a model loaded with DSV4_CUDA_GRAPHS=0 launches directly
 * and gives the same bytes, and DSV4_CUDA_GRAPHS=2 fails the load with one line. The graphs' kernel -> kernel edges
 * are programmatic by default (DSV4_CUDA_PDL=2 since run 51; cu_graph.cu: each kernel launched under the one
 * before, held by dev_grid_wait until it completes); a model loaded with DSV4_CUDA_PDL=0 has plain ones, with 1
 * programmatic ones from launch completion, each giving the same bytes, and DSV4_CUDA_PDL=3 fails the load. (That
 * every kernel begins with the wait is tests/cli/pdl_wait.sh.) The OFFICIAL models' graphs join branches (a layer's
 * independent chains on a second stream, DSV4_CUDA_BRANCH, default on); with DSV4_CUDA_BRANCH=0 they have none and
 * give the same bytes, and DSV4_CUDA_BRANCH=2 fails the load. Models of 4, 6 and 10 layers
 * (2, 3 and 4 graphs a step: layer 0, then up to 4 layers each). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "helpers/testmodel.h"
#include "model/model.h"
#include "model/tiny.h"
#include "backend/cuda/cuda_backend.h"

#define SEQ_LEN 300

typedef struct {
    const char *name, *preset;
    const char *sets[4];
    int n_sets;
    dsv4_mode mode;
    int kv;
} topology;

static const topology topologies[] = {
    {"EXACT flash-like, 6 layers", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_EXACT, DSV4_KV_F32},
    {"OFFICIAL flash-like, 10 layers, fp8 KV", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128,4,128,4,128]", "num_hidden_layers=10", "sliding_window=8", "index_topk=3"}, 4, DSV4_MODE_OFFICIAL, DSV4_KV_FP8},
    {"OFFICIAL pro-like, 4 layers, bf16 KV", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_BF16},
};
#define N_TOPO (int)(sizeof topologies / sizeof topologies[0])

/* Everything a script of steps gave back, in order. */
typedef struct {
    unsigned char *bytes;
    size_t n, cap;
    long steps;
} tape;

static void put(tape *t, const void *p, size_t n) {
    if (t->n + n > t->cap) {
        t->cap = 2 * (t->n + n);
        t->bytes = realloc(t->bytes, t->cap);
        assert_non_null(t->bytes);
    }
    memcpy(t->bytes + t->n, p, n);
    t->n += n;
}

typedef struct {
    dsv4_model *m;
    const topology *tp;
    char dir[256];
    int vocab, hcd;
    int32_t tok[SEQ_LEN], other[SEQ_LEN];
    tape off;              /* the script with direct launches */
} fixture;

static int step(dsv4_model *m, dsv4_step_item *it, int n, tape *t, dsv4_error *err) {
    t->steps++;
    return dsv4_step(m, it, n, err);
}

/* The script (see the top); 0, or the first error. */
static int script(fixture *f, dsv4_model *m, tape *t, dsv4_error *err) {
    const int V = f->vocab;
    const size_t row = sizeof(float) * (size_t)V;
    float *l = malloc(row * SEQ_LEN), *h = malloc(sizeof(float) * (size_t)f->hcd);
    dsv4_seq *s[5] = { 0 };
    int rc = 0;
    for (int i = 0; i < 5 && !rc; i++) rc = dsv4_seq_new(m, &s[i], err);
    /* random chunks */
    dsv4_rng r;
    dsv4_rng_seed(&r, 5);
    for (int done = 0; !rc && done < SEQ_LEN;) {
        int c = 1 + (int)dsv4_rng_below(&r, 40);
        if (c > SEQ_LEN - done) c = SEQ_LEN - done;
        dsv4_step_item it = { s[0], f->tok + done, c, DSV4_LOGITS_ALL, l };
        if (!(rc = step(m, &it, 1, t, err))) put(t, l, row * (size_t)c);
        done += c;
    }
    /* a long one-shot step, then decode with hidden rows */
    if (!rc) {
        dsv4_step_item it = { s[1], f->tok, 150, DSV4_LOGITS_ALL, l };
        if (!(rc = step(m, &it, 1, t, err))) put(t, l, row * 150);
    }
    for (int p = 150; !rc && p < SEQ_LEN; p++) {
        dsv4_step_item it = { s[1], f->tok + p, 1, DSV4_LOGITS_LAST, l, h };
        if (!(rc = step(m, &it, 1, t, err))) {
            put(t, l, row);
            put(t, h, sizeof(float) * (size_t)f->hcd);
        }
    }
    /* three sequences at different positions decoding together */
    static const int start[3] = { 10, 70, 200 };
    for (int i = 0; i < 3 && !rc; i++) {
        dsv4_step_item it = { s[2 + i], f->other, start[i], DSV4_LOGITS_NONE, NULL };
        rc = step(m, &it, 1, t, err);
    }
    const dsv4_sampling sp = { 0.8f, 20, 1.0f, 0.0f, 7, 0 };
    for (int k = 0; !rc && k < 40; k++) {
        int32_t drawn = -1;
        float *lc = l, *le = l + V;   /* item C's row, then item E's two rows */
        dsv4_step_item it[3] = {
            { s[2], f->other + start[0] + k, 1, DSV4_LOGITS_LAST, lc },
            { s[3], f->other + start[1] + k, 1, DSV4_LOGITS_NONE, NULL, NULL, NULL, &sp, (uint64_t)k, &drawn },
            { s[4], f->other + start[2] + 2 * k, 2, DSV4_LOGITS_ALL, le },
        };
        if (!(rc = step(m, it, 3, t, err))) {
            put(t, l, row * 3);
            put(t, &drawn, sizeof drawn);
        }
    }
    for (int i = 0; i < 5; i++) dsv4_seq_free(s[i]);
    free(l);
    free(h);
    return rc;
}

static void run(fixture *f, dsv4_model *m, tape *t, const char *what) {
    dsv4_error err;
    memset(t, 0, sizeof *t);
    if (script(f, m, t, &err)) fail_msg("%s, %s: %s", f->tp->name, what, err.msg);
}

/* The first differing byte, as a float index of the tape (-1: the same). */
static long first_difference(const tape *a, const tape *b) {
    if (a->n != b->n) return 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->bytes[i] != b->bytes[i]) return (long)(i / sizeof(float));
    return -1;
}

static void set_env(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}
static void load_env(const char *value) { set_env("DSV4_CUDA_GRAPHS", value); }

static int setup(void **state, const topology *tp) {
    fixture *f = calloc(1, sizeof *f);
    f->tp = tp;
    load_env(NULL);   /* the defaults, whatever the suite was started with */
    set_env("DSV4_CUDA_PDL", NULL);
    set_env("DSV4_CUDA_BRANCH", NULL);
    f->m = tm_make_on(tp->preset, tp->sets, tp->n_sets, 1234, tp->mode, DSV4_DEVICE_CUDA, tp->kv, f->dir);
    if (!f->m) return -1;
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    f->hcd = f->m->cfg.hc_mult * f->m->cfg.dim;
    tm_tokens(f->tok, SEQ_LEN, f->vocab, 99);
    tm_tokens(f->other, SEQ_LEN, f->vocab, 5);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    free(f->off.bytes);
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

static void graphs_match_direct(void **state) {
    fixture *f = *state;
    cuda_graph_info g0, g1, g2;
    cuda_graphs_get(f->m, &g0);
    if (!g0.on) fail_msg("%s: a model loaded without DSV4_CUDA_GRAPHS has graphs off", f->tp->name);
    tape on;
    run(f, f->m, &on, "graphs on");
    cuda_graphs_get(f->m, &g1);
    printf("  %s: %ld steps as graphs: %ld captures, %ld instantiations, %ld updates, %ld launches\n", f->tp->name,
           g1.graphed_steps - g0.graphed_steps, g1.captures - g0.captures, g1.instantiations - g0.instantiations,
           g1.updates - g0.updates, g1.launches - g0.launches);
    if (g1.graphed_steps - g0.graphed_steps != on.steps || g1.direct_steps != g0.direct_steps)
        fail_msg("%s: %ld of %ld steps ran as graphs, %ld directly", f->tp->name, g1.graphed_steps - g0.graphed_steps, on.steps,
                 g1.direct_steps - g0.direct_steps);
    if (g1.instantiations <= g0.instantiations || g1.launches - g0.launches < on.steps)
        fail_msg("%s: %ld graphs instantiated, %ld launched for %ld steps", f->tp->name, g1.instantiations - g0.instantiations,
                 g1.launches - g0.launches, on.steps);
    if (g1.programmatic_edges <= g0.programmatic_edges)   /* the default DSV4_CUDA_PDL is 2 (run 51) */
        fail_msg("%s: no programmatic edges with the default DSV4_CUDA_PDL", f->tp->name);
    if (g1.updates <= g0.updates)   /* not wrong, but every step paid for instantiating its graphs again */
        fail_msg("%s: no cudaGraphExecUpdate succeeded (%ld instantiations for %ld captures)", f->tp->name,
                 g1.instantiations - g0.instantiations, g1.captures - g0.captures);

    cuda_graphs_set(f->m, 0, 0);
    run(f, f->m, &f->off, "graphs off");
    cuda_graphs_get(f->m, &g2);
    if (g2.graphed_steps != g1.graphed_steps || g2.direct_steps - g1.direct_steps != f->off.steps)
        fail_msg("%s: with graphs off, %ld steps still ran as graphs", f->tp->name, g2.graphed_steps - g1.graphed_steps);
    long d = first_difference(&on, &f->off);
    if (d >= 0) fail_msg("%s: graphs on and off differ (%zu and %zu bytes, first at float %ld)", f->tp->name, on.n, f->off.n, d);

    /* the check can fail: one kernel fewer in every graph changes the bytes (or the step fails) */
    cuda_graphs_set(f->m, 1, 1);
    tape broken;
    dsv4_error err;
    memset(&broken, 0, sizeof broken);
    const int rc = script(f, f->m, &broken, &err);
    if (!rc && first_difference(&broken, &f->off) < 0)
        fail_msg("%s: graphs missing a kernel gave the same bytes: this check cannot fail", f->tp->name);
    printf("  %s: graphs missing a kernel: %s\n", f->tp->name, rc ? err.msg : "different bytes, as they must be");
    free(broken.bytes);

    /* and whole graphs again afterwards */
    cuda_graphs_set(f->m, 1, 0);
    tape again;
    run(f, f->m, &again, "graphs on again");
    if ((d = first_difference(&again, &f->off)) >= 0) fail_msg("%s: graphs on again differ (first at float %ld)", f->tp->name, d);
    free(again.bytes);
    free(on.bytes);
}

/* A load of the fixture's model with name=value set fails with DSV4_E_ARG and one line naming the variable. */
static void expect_load_refused(fixture *f, const char *name, const char *value) {
    set_env(name, value);
    dsv4_load_opts lo = { .mode = f->tp->mode, .quiet = 1, .device = DSV4_DEVICE_CUDA, .kv_format = f->tp->kv };
    dsv4_error err;
    dsv4_model *bad = NULL;
    const int rc = dsv4_model_load(f->dir, &lo, &bad, &err);
    set_env(name, NULL);
    if (rc != DSV4_E_ARG || !strstr(err.msg, name) || strchr(err.msg, '\n'))
        fail_msg("%s=%s: load gave %d (%s)", name, value, rc, rc ? err.msg : "no error");
    if (!rc) dsv4_model_free(bad);
}

/* DSV4_CUDA_GRAPHS=0 at load launches directly, with the same bytes; a value other than 0 or 1 fails the load. */
static void env_switch(void **state) {
    fixture *f = *state;
    if (!f->off.bytes) skip();   /* graphs_match_direct ran first and failed */
    load_env("0");
    dsv4_model *m = tm_load(f->dir, f->tp->mode, DSV4_DEVICE_CUDA, f->tp->kv);
    load_env(NULL);
    assert_non_null(m);
    cuda_graph_info g;
    cuda_graphs_get(m, &g);
    if (g.on) fail_msg("%s: DSV4_CUDA_GRAPHS=0 left graphs on", f->tp->name);
    tape t;
    run(f, m, &t, "DSV4_CUDA_GRAPHS=0");
    cuda_graphs_get(m, &g);
    if (g.graphed_steps || g.direct_steps != t.steps) fail_msg("%s: DSV4_CUDA_GRAPHS=0 ran %ld steps as graphs", f->tp->name, g.graphed_steps);
    const long d = first_difference(&t, &f->off);
    if (d >= 0) fail_msg("%s: DSV4_CUDA_GRAPHS=0 differs from graphs switched off (first at float %ld)", f->tp->name, d);
    free(t.bytes);
    dsv4_model_free(m);

    expect_load_refused(f, "DSV4_CUDA_GRAPHS", "2");
}

/* DSV4_CUDA_BRANCH (cuda_step.c branch_fork): the default model's graphs join branches where the layers have them
 * (a ratio-4 layer's indexer queries beside wq_b in either mode; OFFICIAL on tensor cores also the shared expert
 * beside the routed experts and the compressors beside the query path); a model loaded with DSV4_CUDA_BRANCH=0 has
 * none, and both give the bytes of the direct launches (one of which ran the branches on their own stream);
 * DSV4_CUDA_BRANCH=2 fails the load. */
static void branch_switch(void **state) {
    fixture *f = *state;
    if (!f->off.bytes) skip();
    cuda_graph_info g;
    cuda_graphs_get(f->m, &g);
    int expect = f->tp->mode == DSV4_MODE_OFFICIAL && cuda_mma_on(f->m);
    for (int L = 0; L < f->m->cfg.n_layers; L++) expect |= cfg_ratio(&f->m->cfg, L) == 4;
    if (expect ? g.joins <= 0 : g.joins != 0)
        fail_msg("%s: %ld joins in %ld captures with the default DSV4_CUDA_BRANCH", f->tp->name, g.joins, g.captures);
    printf("  %s: %.1f joins a capture by default\n", f->tp->name, (double)g.joins / (double)(g.captures ? g.captures : 1));
    set_env("DSV4_CUDA_BRANCH", "0");
    dsv4_model *m = tm_load(f->dir, f->tp->mode, DSV4_DEVICE_CUDA, f->tp->kv);
    set_env("DSV4_CUDA_BRANCH", NULL);
    assert_non_null(m);
    tape t;
    run(f, m, &t, "DSV4_CUDA_BRANCH=0");
    cuda_graphs_get(m, &g);
    if (g.graphed_steps != t.steps || g.joins != 0)
        fail_msg("%s: DSV4_CUDA_BRANCH=0: %ld of %ld steps as graphs, %ld joins", f->tp->name, g.graphed_steps, t.steps, g.joins);
    const long d = first_difference(&t, &f->off);
    if (d >= 0) fail_msg("%s: DSV4_CUDA_BRANCH=0 differs from direct launches (first at float %ld)", f->tp->name, d);
    free(t.bytes);
    dsv4_model_free(m);

    expect_load_refused(f, "DSV4_CUDA_BRANCH", "2");
}

/* DSV4_CUDA_PDL=0, 1 and 2 at load: graphs with plain edges, or programmatic ones (from launch completion, from
 * exit), the same bytes as direct launches; DSV4_CUDA_PDL=3 fails the load. */
static void pdl_switch(void **state) {
    fixture *f = *state;
    if (!f->off.bytes) skip();
    for (int mode = 0; mode <= 2; mode++) {
        const char *v = mode == 0 ? "0" : mode == 1 ? "1" : "2";
        set_env("DSV4_CUDA_PDL", v);
        dsv4_model *m = tm_load(f->dir, f->tp->mode, DSV4_DEVICE_CUDA, f->tp->kv);
        set_env("DSV4_CUDA_PDL", NULL);
        assert_non_null(m);
        tape t;
        run(f, m, &t, mode == 0 ? "DSV4_CUDA_PDL=0" : mode == 1 ? "DSV4_CUDA_PDL=1" : "DSV4_CUDA_PDL=2");
        cuda_graph_info g;
        cuda_graphs_get(m, &g);
        if (g.graphed_steps != t.steps || (mode ? g.programmatic_edges <= 0 : g.programmatic_edges != 0))
            fail_msg("%s: DSV4_CUDA_PDL=%s: %ld of %ld steps as graphs, %ld programmatic edges", f->tp->name, v, g.graphed_steps,
                     t.steps, g.programmatic_edges);
        printf("  %s: DSV4_CUDA_PDL=%s: %.1f programmatic edges a capture\n", f->tp->name, v,
               (double)g.programmatic_edges / (double)(g.captures ? g.captures : 1));
        const long d = first_difference(&t, &f->off);
        if (d >= 0) fail_msg("%s: DSV4_CUDA_PDL=%s differs from direct launches (first at float %ld)", f->tp->name, v, d);
        free(t.bytes);
        dsv4_model_free(m);
    }

    expect_load_refused(f, "DSV4_CUDA_PDL", "3");
}

static void both(void **state) {
    graphs_match_direct(state);
    env_switch(state);
    pdl_switch(state);
    branch_switch(state);
}

#define TOPO(i) static int setup_##i(void **s) { return setup(s, &topologies[i]); }
TOPO(0) TOPO(1) TOPO(2)

int main(void) {
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu graphs: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    int (*setups[])(void **) = { setup_0, setup_1, setup_2 };
    struct CMUnitTest tests[N_TOPO];
    for (int i = 0; i < N_TOPO; i++) tests[i] = (struct CMUnitTest){ topologies[i].name, both, setups[i], teardown, NULL };
    return _cmocka_run_group_tests("gpu graphs (memcmp, graphs on and off)", tests, N_TOPO, NULL, NULL);
}
