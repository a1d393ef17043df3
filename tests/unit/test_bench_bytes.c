/* What the benchmark counts. The multi-stream benchmark's bytes per step on a device that does not count them
 * (bench_streams.h bench_step_routed_bytes: from the step's routing, model/route_count.h) against the CPU MoE's own
 * count (m->routed_bytes, core/moe.c): the same number for the same step, with one stream and with several whose
 * tokens share experts. A token's linear work (model/footprint.h dsv4_token_linear_flops) against the tensor
 * shapes of spec/DEEPSEEK_V4.md written out by hand. The kernel sets' multiply-add peak (isa.h peak_flops): the
 * flops each set says it did. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include "engine/bench_streams.h"
#include "helpers/testmodel.h"
#include "model/model.h"
#include "model/footprint.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/peak.h"
#include <math.h>

static void counted_equals_moe(void **state) {
    (void)state;
    static const char *const sets[] = { "compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3" };
    char dir[256];
    dsv4_model *m = tm_make("flash-tiny", sets, 3, 77, DSV4_MODE_EXACT, dir);
    assert_non_null(m);
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    enum { S = 5, P = 9 };
    dsv4_seq *seq[S];
    int32_t prompt[S][P], next[S];
    float *logits = malloc(sizeof(float) * (size_t)S * (size_t)info.vocab_size);
    dsv4_step_item items[S];
    dsv4_error err;
    for (int i = 0; i < S; i++) {
        tm_tokens(prompt[i], P, info.vocab_size, 100 + (uint64_t)i);
        if (dsv4_seq_new(m, &seq[i], &err)) fail_msg("seq: %s", err.msg);
        items[i] = (dsv4_step_item){ seq[i], prompt[i], P, DSV4_LOGITS_NONE, NULL };
        next[i] = (int32_t)((7 * i + 3) % info.vocab_size);
    }
    if (dsv4_step(m, items, S, &err)) fail_msg("prefill: %s", err.msg);
    for (int n = 1; n <= S; n += S - 1) {   /* one stream, then all five */
        for (int i = 0; i < n; i++)
            items[i] = (dsv4_step_item){ seq[i], &next[i], 1, DSV4_LOGITS_LAST, logits + (int64_t)i * info.vocab_size };
        const uint64_t before = m->routed_bytes;
        double counted = -1;
        if (bench_step_routed_bytes(m, items, n, &counted, &err)) fail_msg("counted step: %s", err.msg);
        const double moe = (double)(m->routed_bytes - before);
        if (!(moe > 0) || counted != moe) fail_msg("%d streams: counted %.0f bytes, the MoE read %.0f", n, counted, moe);
    }
    for (int i = 0; i < S; i++) dsv4_seq_free(seq[i]);
    free(logits);
    dsv4_model_free(m);
    tm_rmdir(dir);
}

/* Every linear a token passes through, by the checkpoint's shapes (spec/DEEPSEEK_V4.md §2's tensor table): 2 flops
 * per weight element. flash-tiny has a CSA (m = 4) and an HCA (m = 128) layer after two window-only ones, so each
 * kind of block is counted. */
static void linear_flops_by_hand(void **state) {
    (void)state;
    static const char *const sets[] = { "compress_ratios=[0,0,4,128]", "sliding_window=8", "index_topk=3" };
    char dir[256];
    dsv4_model *m = tm_make("flash-tiny", sets, 3, 78, DSV4_MODE_EXACT, dir);
    assert_non_null(m);
    const dsv4_config *c = &m->cfg;
    const double d = c->dim, H = c->n_heads, D = c->head_dim, hc = c->hc_mult, I = c->moe_inter;
    double e = (double)c->vocab_size * d + hc * (hc * d);   /* head, hc_head_fn */
    for (int l = 0; l < c->n_layers; l++) {
        const int r = c->compress_ratio[l];
        e += 2 * ((2 + hc) * hc) * (hc * d);                       /* hc_attn_fn, hc_ffn_fn [24, hc d] at hc 4 */
        e += c->q_lora * d + H * D * c->q_lora + D * d;            /* wq_a, wq_b, wkv */
        e += (double)c->o_groups * c->o_lora * (H * D / c->o_groups) + d * c->o_groups * c->o_lora;   /* wo_a, wo_b */
        if (r) e += 2 * ((r == 4 ? 2 : 1) * D) * d;                /* compressor wkv, wgate: CSA [2D, d], HCA [D, d] */
        if (r == 4)                                                /* indexer wq_b, weights_proj, its compressor */
            e += (double)c->index_n_heads * c->index_head_dim * c->q_lora + c->index_n_heads * d +
                 2 * (2.0 * c->index_head_dim) * d;
        e += c->n_routed * d + 3 * I * d + c->n_act * 3 * I * d;   /* gate, shared expert, n_act routed experts */
    }
    assert_true(c->n_layers == 4 && c->compress_ratio[2] == 4 && c->compress_ratio[3] == 128);
    const double got = (double)dsv4_token_linear_flops(m);
    if (got != 2 * e) fail_msg("token linear flops %.0f, by hand %.0f", got, 2 * e);
    dsv4_model_free(m);
    tm_rmdir(dir);
}

/* Each kernel set this CPU runs reports the flops its loop is written to do (12 chains x steps x the instruction's,
 * isa/peak.c) and leaves a finite result; the pool's measurement is a positive rate. The fp32 FMA is the set's
 * width; VDPBF16PS (twice its flops) is the avx512bf16 set's, and the avx512 set's only where the compiler's own
 * -march has AVX512-BF16 (a -march=native build on such a CPU: pairs.c's VDPBF16PS tiles follow the same test). */
static void peak_counts(void **state) {
    (void)state;
    const char *names[] = { "avx512bf16", "avx512", "avx2", "scalar" };
    const double fma[] = { 32 * 12, 32 * 12, 16 * 12, 2 * 12 };
    for (int i = 0; i < 4; i++) {
        const cpu_kernels *k;
        dsv4_error err;
        if (cpu_kernels_pick(names[i], &k, &err)) continue;   /* not built, or not this CPU */
        float sink = 0;
        const double bf16 = k->peak_flops(1, 1000, &sink), f32 = k->peak_flops(0, 1000, &sink);
        const int dp_ok = i == 0 ? bf16 == 2 * f32 : i == 1 ? bf16 == f32 || bf16 == 2 * f32 : bf16 == f32;
        if (f32 != 1000 * fma[i] || !dp_ok) fail_msg("%s: %.0f / %.0f flops for 1000 steps", names[i], bf16, f32);
        assert_true(isfinite(sink) && sink > 0);
    }
    dsv4_pool *p = dsv4_pool_new(2);
    assert_non_null(p);
    assert_true(cpu_peak_gflops(p, 1, 1) > 0 && cpu_peak_gflops(p, 0, 1) > 0);
    dsv4_pool_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = { cmocka_unit_test(counted_equals_moe), cmocka_unit_test(linear_flops_by_hand),
                                        cmocka_unit_test(peak_counts) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
