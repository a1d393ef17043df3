/* Bad input on the GPU (issue 11, "what must hold" 5): the same one-line errors as on the CPU (both devices run
 * one step_validate, so context overflow and every other step check are shared code), and no sequence
 * changed — bad token ids, a sequence of the other device, damaged state files — and running
 * out of GPU memory is an input error with the numbers, after which the model keeps working. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "helpers/testmodel.h"
#include "model/tiny.h"

typedef struct {
    dsv4_model *cpu, *gpu;
    char dir[256];
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    /* no ratio-128 layer: a step of millions of tokens is then limited by memory alone (see out_of_gpu_memory) */
    const char *sets[] = {"compress_ratios=[0,0,4,4,4,0]", "sliding_window=8", "index_topk=3", "max_position_embeddings=16777216"};
    f->cpu = tm_make_on("flash-tiny", sets, 4, 77, DSV4_MODE_EXACT, DSV4_DEVICE_CPU, DSV4_KV_F32, f->dir);
    f->gpu = f->cpu ? tm_load(f->dir, DSV4_MODE_EXACT, DSV4_DEVICE_CUDA, DSV4_KV_F32) : NULL;
    *state = f;
    return f->gpu ? 0 : -1;
}

static int teardown(void **state) {
    fixture *f = *state;
    dsv4_model_free(f->gpu);
    dsv4_model_free(f->cpu);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

/* The same step on both devices fails with the same code and message, and leaves both sequences at `pos`. */
static void same_error(fixture *f, const int32_t *tok, int n, int prefill) {
    dsv4_seq *c, *g;
    dsv4_error ec, eg;
    assert_int_equal(dsv4_seq_new(f->cpu, &c, &ec), 0);
    assert_int_equal(dsv4_seq_new(f->gpu, &g, &eg), 0);
    int32_t pre[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    if (prefill) {
        dsv4_step_item a = { c, pre, prefill, DSV4_LOGITS_NONE, NULL }, b = { g, pre, prefill, DSV4_LOGITS_NONE, NULL };
        assert_int_equal(dsv4_step(f->cpu, &a, 1, &ec), 0);
        assert_int_equal(dsv4_step(f->gpu, &b, 1, &eg), 0);
    }
    dsv4_step_item a = { c, tok, n, DSV4_LOGITS_NONE, NULL }, b = { g, tok, n, DSV4_LOGITS_NONE, NULL };
    const int rc = dsv4_step(f->cpu, &a, 1, &ec), rg = dsv4_step(f->gpu, &b, 1, &eg);
    assert_int_not_equal(rc, 0);
    assert_int_equal(rc, rg);
    assert_string_equal(ec.msg, eg.msg);
    assert_int_equal(dsv4_seq_position(g), prefill);
    printf("  cpu and gpu: %s\n", eg.msg);
    dsv4_seq_free(c);
    dsv4_seq_free(g);
}

static void bad_ids(void **state) {
    fixture *f = *state;
    int32_t bad[3] = {5, 512, 7}, neg[2] = {-1, 3};
    same_error(f, bad, 3, 0);
    same_error(f, neg, 2, 4);
}

static void wrong_device_sequence(void **state) {
    fixture *f = *state;
    dsv4_seq *c;
    dsv4_error err;
    assert_int_equal(dsv4_seq_new(f->cpu, &c, &err), 0);
    int32_t t[2] = {1, 2};
    dsv4_step_item it = { c, t, 2, DSV4_LOGITS_NONE, NULL };
    assert_int_equal(dsv4_step(f->gpu, &it, 1, &err), DSV4_E_ARG);
    printf("  %s\n", err.msg);
    assert_int_equal(dsv4_seq_position(c), 0);
    dsv4_seq_free(c);
}

static void damaged_states(void **state) {
    fixture *f = *state;
    dsv4_seq *g, *r;
    dsv4_error ec, eg;
    assert_int_equal(dsv4_seq_new(f->gpu, &g, &eg), 0);
    int32_t t[40];
    tm_tokens(t, 40, 512, 1);
    dsv4_step_item it = { g, t, 40, DSV4_LOGITS_NONE, NULL };
    assert_int_equal(dsv4_step(f->gpu, &it, 1, &eg), 0);
    void *buf;
    size_t len;
    assert_int_equal(dsv4_seq_save_mem(g, &buf, &len, &eg), 0);
    uint8_t *bad = malloc(len);
    const size_t cuts[] = {0, 11, 100, len / 2, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        const int rc = dsv4_seq_load_mem(f->cpu, buf, cuts[i], &r, &ec), rg = dsv4_seq_load_mem(f->gpu, buf, cuts[i], &r, &eg);
        assert_int_not_equal(rg, 0);
        assert_int_equal(rc, rg);
        assert_string_equal(ec.msg, eg.msg);
    }
    memcpy(bad, buf, len);
    bad[len / 2] ^= 0x40;
    assert_int_equal(dsv4_seq_restore_mem(g, bad, len, &eg), DSV4_E_FORMAT);
    printf("  %s\n", eg.msg);
    assert_int_equal(dsv4_seq_position(g), 40);
    /* the restore that failed changed nothing: the state saves to the same bytes */
    void *again;
    size_t len2;
    assert_int_equal(dsv4_seq_save_mem(g, &again, &len2, &eg), 0);
    assert_true(len2 == len && !memcmp(again, buf, len));
    free(again);
    free(bad);
    free(buf);
    dsv4_seq_free(g);
}

/* A step whose scratch cannot fit (8M tokens of ~25 KB each, more than the 141 GB of an H200): a one-line error with
 * the numbers, the sequence unchanged, the model fine. */
static void out_of_gpu_memory(void **state) {
    fixture *f = *state;
    const int n = 1 << 23;
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) t[i] = i % 512;
    dsv4_seq *g;
    dsv4_error err;
    assert_int_equal(dsv4_seq_new(f->gpu, &g, &err), 0);
    dsv4_step_item it = { g, t, n, DSV4_LOGITS_NONE, NULL };
    assert_int_equal(dsv4_step(f->gpu, &it, 1, &err), DSV4_E_NOMEM);
    printf("  %s\n", err.msg);
    assert_non_null(strstr(err.msg, "out of GPU memory"));
    assert_int_equal(dsv4_seq_position(g), 0);
    float l[512];
    dsv4_step_item ok = { g, t, 5, DSV4_LOGITS_LAST, l };
    assert_int_equal(dsv4_step(f->gpu, &ok, 1, &err), 0);
    assert_int_equal(dsv4_seq_position(g), 5);
    dsv4_seq_free(g);
    free(t);
}

int main(void) {
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu errors: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_ids),
        cmocka_unit_test(wrong_device_sequence),
        cmocka_unit_test(damaged_states),
        cmocka_unit_test(out_of_gpu_memory),
    };
    return cmocka_run_group_tests_name("gpu bad input", tests, setup, teardown);
}
