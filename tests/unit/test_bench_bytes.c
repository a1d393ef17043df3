/* The multi-stream benchmark's bytes per step on a device that does not count them (bench_streams.h
 * bench_step_routed_bytes: from the step's routing, model/route_count.h) against the CPU MoE's own count
 * (m->routed_bytes, core/moe.c): the same number for the same step, with one stream and with several whose
 * tokens share experts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include "engine/bench_streams.h"
#include "helpers/testmodel.h"
#include "model/model.h"

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

int main(void) {
    const struct CMUnitTest tests[] = { cmocka_unit_test(counted_equals_moe) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
