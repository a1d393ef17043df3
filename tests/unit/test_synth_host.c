/* A synthetic checkpoint (model/synthetic.h) on the CPU: the holes its writer left (zeros on read) are filled in host
 * memory with the documented values, the real tensors are copied byte for byte, and past a budget the routed experts'
 * tensors share the bytes of earlier ones of their dtype and shape in a cycle. The reference values come from
 * sample_math.h's splitmix64 (test_sampler checks it against the generator's published outputs), not from the code
 * under test; the sharing rule is checked pointer by pointer; a model with shared experts still gives the same logits
 * one-shot and chunked. A budget smaller than the non-expert tensors, or a malformed DSV4_SYNTHETIC_HOST_GB, is a clear
 * error. */
#define _DEFAULT_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/sample_math.h"
#include "helpers/testmodel.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/synthetic.h"
#include "model/tiny.h"

#define N 14

static const char *const SETS[] = {"dsv4_synthetic=holes", "compress_ratios=[0,0,4,128]", "num_hidden_layers=4",
                                   "sliding_window=8", "index_topk=3"};

typedef struct {
    char dir[64];
    st_archive file;   /* the checkpoint as written: holes read as zeros */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    strcpy(f->dir, "/tmp/dsv4-test-synth-XXXXXX");
    if (!f || !mkdtemp(f->dir)) return -1;
    dsv4_tiny_opts o = { .preset = "flash-tiny", .seed = 5, .sets = SETS, .n_sets = 5, .n_shards = 2 };
    dsv4_error err;
    if (dsv4_tiny_write(f->dir, &o, &err) || st_open_dir(f->dir, &f->file, &err)) {
        fprintf(stderr, "synthetic checkpoint: %s\n", err.msg);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    unsetenv("DSV4_SYNTHETIC_HOST_GB");
    if (f) {
        st_close(&f->file);
        tm_rmdir(f->dir);
    }
    free(f);
    return 0;
}

static int is_expert(const st_tensor *t) { return strstr(t->name, ".ffn.experts.") != NULL; }

static size_t up64(size_t n) { return (n + 63) / 64 * 64; }

/* splitmix64's next output from state s: the state advanced by the golden gamma, then the output function */
static uint64_t splitmix64_next(uint64_t s) { return sm_mix64(s + SM_GOLDEN); }

/* Byte p of the hole of tensor index i, by synthetic.h's definition: word p/8 of seed 0x5eed0000 + i is
 * next(seed XOR next(p/8)); FP8 keeps the sign and mantissa and sets exponent 5 + two bits, BF16
 * values take 16 bits each with exponent 119 + two bits, FP4 is the byte itself, scales are 121. */
static uint8_t expected_byte(const st_tensor *t, int i, size_t p) {
    if (t->dtype == ST_F8_E8M0) return 121;
    const uint64_t h = splitmix64_next((0x5eed0000ULL + (uint64_t)i) ^ splitmix64_next(p / 8));
    if (t->dtype == ST_BF16) {
        const unsigned r = (unsigned)(h >> (16 * ((p % 8) / 2))) & 0xffff;
        const unsigned v = (r & 0x8000) | ((119 + ((r >> 7) & 3)) << 7) | (r & 0x7f);
        return (uint8_t)(p % 2 ? v >> 8 : v);
    }
    const unsigned r = (unsigned)(h >> (8 * (p % 8))) & 0xff;
    return t->dtype == ST_F8_E4M3 ? (uint8_t)((r & 0x80) | ((5 + ((r >> 3) & 3)) << 3) | (r & 7)) : (uint8_t)r;
}

static dsv4_model *load(const fixture *f) { return tm_load(f->dir, DSV4_MODE_OFFICIAL, DSV4_DEVICE_CPU, DSV4_KV_F32); }

/* Enough room for everything: every hole has bytes of its own, the documented values; every real tensor the file's. */
static void holes_filled_real_tensors_copied(void **state) {
    const fixture *f = *state;
    dsv4_model *m = load(f);
    assert_non_null(m);
    assert_int_equal(m->weight_memory, ST_MEM_COPY);
    assert_int_equal(m->ckpt.n_tensors, f->file.n_tensors);
    int holes = 0, experts = 0;
    for (int i = 0; i < f->file.n_tensors; i++) {
        const st_tensor *file = &f->file.tensors[i], *mem = &m->ckpt.tensors[i];
        assert_string_equal(file->name, mem->name);
        const uint8_t *a = mem->data, *z = file->data;
        assert_true(a >= m->synth.base && a + mem->nbytes <= m->synth.base + m->synth.bytes);
        if (!synthetic_hole_tensor(file->dtype, file->nbytes)) {
            assert_memory_equal(a, z, file->nbytes);
            continue;
        }
        holes++;
        experts += is_expert(file);
        for (size_t p = 0; p < file->nbytes; p++) assert_int_equal(z[p], 0);   /* the writer left a hole */
        for (size_t p = 0; p < file->nbytes; p++)
            if (a[p] != expected_byte(file, i, p)) fail_msg("%s byte %zu: %u, expected %u", file->name, p, a[p], expected_byte(file, i, p));
    }
    assert_true(holes > 0 && experts > 0);
    assert_int_equal(m->synth.expert_tensors, experts);
    assert_int_equal(m->synth.expert_own, experts);
    dsv4_model_free(m);
}

/* Bytes a model needs with `own_experts` expert holes of their own (the writer's order, every kind at least once). */
static size_t bytes_with(const st_archive *a, int own_experts) {
    size_t b = 0;
    int seen = 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const st_tensor *t = &a->tensors[i];
        if (!is_expert(t) || !synthetic_hole_tensor(t->dtype, t->nbytes)) b += up64(t->nbytes);
        else if (seen++ < own_experts) b += up64(t->nbytes);
    }
    return b;
}

/* A budget with room for a few experts: the first expert tensors (in the checkpoint's order) have their own bytes,
 * each later one that does not fit points at the (k mod n)-th own tensor of its dtype and shape, k counting the earlier sharers of that
 * kind; and that model gives the same logits one-shot and in chunks. */
static void experts_past_the_budget_share_in_a_cycle(void **state) {
    const fixture *f = *state;
    const int own_wanted = 40;
    char gb[64];
    snprintf(gb, sizeof gb, "%.12f", (double)bytes_with(&f->file, own_wanted) / 1073741824.0 + 1e-12);
    setenv("DSV4_SYNTHETIC_HOST_GB", gb, 1);
    dsv4_model *m = load(f);
    unsetenv("DSV4_SYNTHETIC_HOST_GB");
    assert_non_null(m);
    assert_true(m->synth.expert_own >= own_wanted - 6 && m->synth.expert_own <= own_wanted);
    assert_true(m->synth.expert_own < m->synth.expert_tensors);
    /* walk the expert holes in order, keeping per kind the own ones and the count of sharers */
    enum { MAXK = 16 };
    const st_tensor *kind[MAXK];
    const void *own[MAXK][64];
    int n_own[MAXK] = {0}, n_shared[MAXK] = {0}, n_kinds = 0;
    int64_t seen_own = 0, seen_shared = 0;
    for (int i = 0; i < m->ckpt.n_tensors; i++) {
        const st_tensor *t = &m->ckpt.tensors[i];
        if (!is_expert(t) || !synthetic_hole_tensor(t->dtype, t->nbytes)) continue;
        int k = 0;
        while (k < n_kinds && !(kind[k]->dtype == t->dtype && !memcmp(kind[k]->shape, t->shape, sizeof t->shape))) k++;
        if (k == n_kinds) {
            assert_true(n_kinds < MAXK);
            kind[n_kinds++] = t;
        }
        int earlier = 0;   /* the bytes of an earlier own tensor of its kind: a sharer */
        for (int j = 0; j < n_own[k]; j++) earlier |= own[k][j] == t->data;
        if (!earlier) {   /* bytes of its own: the documented values of its own seed */
            const uint8_t *a = t->data;
            for (size_t p = 0; p < 64 && p < t->nbytes; p++) assert_int_equal(a[p], expected_byte(&f->file.tensors[i], i, p));
            assert_true(n_own[k] < 64);
            own[k][n_own[k]++] = t->data;
            seen_own++;
            continue;
        }
        assert_true(n_own[k] > 0);
        assert_ptr_equal(t->data, own[k][n_shared[k] % n_own[k]]);
        n_shared[k]++;
        seen_shared++;
    }
    assert_int_equal(seen_own, m->synth.expert_own);
    assert_int_equal(seen_own + seen_shared, m->synth.expert_tensors);
    assert_true(m->synth.bytes <= bytes_with(&f->file, own_wanted));
    /* the model runs on shared experts: finite logits, chunked = one-shot */
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    int32_t tok[N];
    tm_tokens(tok, N, info.vocab_size, 3);
    const int one[] = {N}, some[] = {5, 4, 2};
    float *a = tm_logits(m, tok, N, one, 1), *b = tm_logits(m, tok, N, some, 3);
    assert_non_null(a);
    assert_non_null(b);
    for (size_t i = 0; i < (size_t)N * info.vocab_size; i++) assert_true(isfinite(a[i]));
    assert_memory_equal(a, b, sizeof(float) * N * info.vocab_size);
    free(a);
    free(b);
    dsv4_model_free(m);
}

static void bad_budgets_are_errors(void **state) {
    const fixture *f = *state;
    dsv4_load_opts o = { .mode = DSV4_MODE_OFFICIAL, .quiet = 1 };
    dsv4_model *m = NULL;
    dsv4_error err;
    char gb[64];   /* one byte short of the non-expert tensors */
    snprintf(gb, sizeof gb, "%.12f", (double)(bytes_with(&f->file, 0) - 1) / 1073741824.0);
    setenv("DSV4_SYNTHETIC_HOST_GB", gb, 1);
    assert_int_equal(dsv4_model_load(f->dir, &o, &m, &err), DSV4_E_NOMEM);
    assert_null(m);
    assert_non_null(strstr(err.msg, "other than the routed experts"));
    assert_non_null(strstr(err.msg, "DSV4_SYNTHETIC_HOST_GB"));
    const char *bad[] = {"", "abc", "0", "-1", "2x", "nan"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("DSV4_SYNTHETIC_HOST_GB", bad[i], 1);
        assert_int_equal(dsv4_model_load(f->dir, &o, &m, &err), DSV4_E_ARG);
        assert_null(m);
        assert_non_null(strstr(err.msg, "DSV4_SYNTHETIC_HOST_GB"));
    }
    unsetenv("DSV4_SYNTHETIC_HOST_GB");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(holes_filled_real_tensors_copied),
        cmocka_unit_test(experts_past_the_budget_share_in_a_cycle),
        cmocka_unit_test(bad_budgets_are_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
