/* The CPU step profile (core/profile.h, dsv4 bench --profile): timing changes no value (the logits with it on are
 * the logits with it off, by memcmp), it counts every step, charges no stage a negative time, and its stages add up to
 * no more than the wall time of the calls they were measured in (the time between steps is charged to none). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "core/profile.h"
#include "helpers/testmodel.h"
#include "model/model.h"

#define N 12

static void profile_counts_steps_and_changes_nothing(void **state) {
    (void)state;
    static const char *const sets[] = {"compress_ratios=[0,0,4,128]", "num_hidden_layers=4", "sliding_window=8", "index_topk=3"};
    char dir[256];
    dsv4_model *m = tm_make("flash-tiny", sets, 4, 11, DSV4_MODE_OFFICIAL, dir);
    assert_non_null(m);
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int32_t tok[N];
    tm_tokens(tok, N, info.vocab_size, 5);
    const int chunks[] = {5};   /* one step of 5, then 7 of one token */
    assert_int_equal(m->prof.on, 0);
    float *off = tm_logits(m, tok, N, chunks, 1);
    assert_non_null(off);
    assert_int_equal(m->prof.steps, 0);   /* off: nothing counted */
    m->prof = (cpu_profile){ .on = 1 };
    const double t0 = cpu_profile_now_ms();
    float *on = tm_logits(m, tok, N, chunks, 1);
    const double wall = cpu_profile_now_ms() - t0;
    assert_non_null(on);
    assert_memory_equal(off, on, sizeof(float) * N * (size_t)info.vocab_size);
    assert_int_equal(m->prof.steps, 1 + (N - 5));
    double sum = 0;
    for (int s = 0; s < CP_COUNT; s++) {
        assert_true(m->prof.ms[s] >= 0);
        sum += m->prof.ms[s];
    }
    assert_true(sum > 0 && sum <= wall);
    assert_true(m->prof.ms[CP_EXPERTS] > 0 && m->prof.ms[CP_QKV] > 0 && m->prof.ms[CP_HEAD] > 0);
    free(off);
    free(on);
    dsv4_model_free(m);
    tm_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(profile_counts_steps_and_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
