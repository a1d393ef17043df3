/* Expert parallelism on several GPUs (issue 16): a model whose routed experts are spread over 2 GPUs gives the
 * same bits (memcmp) as the same checkpoint on one GPU — one-shot, token by token, random chunks, batched beside
 * another stream, speculative steps rolled back — in both numeric modes and with fp8 KV; a state saved on 2 GPUs
 * restores on 1 and continues there identically, and the other way round; a GPU of the set that cannot hold its
 * share fails the load with one line naming it, and leaves nothing allocated (a load right after succeeds).
 * Needs 2 GPUs; on fewer it says so in one line and passes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cu_runtime.h"
#include "helpers/testmodel.h"
#include "model/tiny.h"

#define SEQ_LEN 200

typedef struct {
    const char *name, *preset;
    const char *sets[6];
    int n_sets;
    dsv4_mode mode;
    int kv;
} topology;

static const topology topologies[] = {
    {"EXACT flash-like", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_EXACT, DSV4_KV_F32},
    {"OFFICIAL flash-like", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_F32},
    {"OFFICIAL pro-like, fp8 KV", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3, DSV4_MODE_OFFICIAL, DSV4_KV_FP8},
    {"EXACT 7 experts over 2 GPUs (uneven)", "flash-tiny", {"compress_ratios=[0,0,4,128]", "num_hidden_layers=4", "sliding_window=8", "n_routed_experts=7"}, 4, DSV4_MODE_EXACT, DSV4_KV_F32},
};
#define N_TOPO (int)(sizeof topologies / sizeof topologies[0])

typedef struct {
    dsv4_model *one, *two;   /* the same checkpoint on GPU 0, and over GPUs 0 and 1 */
    char dir[256];
    int vocab;
    int32_t tok[SEQ_LEN], other[SEQ_LEN];
    float *ref, *ref_other;  /* one-GPU one-shot logits */
} fixture;

static size_t rows(const fixture *f, int n) { return sizeof(float) * (size_t)n * (size_t)f->vocab; }

static void expect_rows(const fixture *f, const float *got, const float *want, int from, int to, const char *what) {
    for (int p = from; p < to; p++)
        if (memcmp(got + (int64_t)p * f->vocab, want + (int64_t)p * f->vocab, rows(f, 1)))
            fail_msg("%s: position %d differs from the one-GPU run", what, p);
}

static dsv4_model *load_on(const char *dir, const topology *tp, int n_gpus, dsv4_error *err) {
    dsv4_load_opts lo = { .mode = tp->mode, .quiet = 1, .device = DSV4_DEVICE_CUDA, .kv_format = tp->kv, .n_gpus = n_gpus };
    dsv4_model *m = NULL;
    return dsv4_model_load(dir, &lo, &m, err) ? NULL : m;
}

static void step1(dsv4_model *m, dsv4_seq *s, const int32_t *t, int n, float *out) {
    dsv4_error err;
    dsv4_step_item it = { s, t, n, DSV4_LOGITS_ALL, out };
    if (dsv4_step(m, &it, 1, &err)) fail_msg("step: %s", err.msg);
}

static int setup(void **state, const topology *tp) {
    fixture *f = calloc(1, sizeof *f);
    f->one = tm_make_on(tp->preset, tp->sets, tp->n_sets, 4321, tp->mode, DSV4_DEVICE_CUDA, tp->kv, f->dir);
    if (!f->one) return -1;
    dsv4_error err;
    if (!(f->two = load_on(f->dir, tp, 2, &err))) { fprintf(stderr, "load on 2 GPUs: %s\n", err.msg); return -1; }
    dsv4_model_info info;
    dsv4_model_get_info(f->one, &info);
    f->vocab = info.vocab_size;
    tm_tokens(f->tok, SEQ_LEN, f->vocab, 17);
    tm_tokens(f->other, SEQ_LEN, f->vocab, 23);
    f->ref = tm_logits(f->one, f->tok, SEQ_LEN, NULL, 0);
    f->ref_other = tm_logits(f->one, f->other, SEQ_LEN, NULL, 0);
    if (!f->ref || !f->ref_other) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    free(f->ref);
    free(f->ref_other);
    dsv4_model_free(f->two);
    dsv4_model_free(f->one);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

static void one_shot_and_chunks(fixture *f) {
    float *l = tm_logits(f->two, f->tok, SEQ_LEN, NULL, 0);
    assert_non_null(l);
    expect_rows(f, l, f->ref, 0, SEQ_LEN, "2 GPUs, one shot");
    free(l);
    int one[1] = { 1 };
    l = tm_logits(f->two, f->tok, SEQ_LEN, one, 1);
    assert_non_null(l);
    expect_rows(f, l, f->ref, 0, SEQ_LEN, "2 GPUs, token by token");
    free(l);
    dsv4_rng r;
    dsv4_rng_seed(&r, 5);
    int chunks[SEQ_LEN], n = 0, sum = 0;
    while (sum < SEQ_LEN) {
        const int c = 1 + (int)dsv4_rng_below(&r, 40);
        chunks[n++] = c;
        sum += c;
    }
    l = tm_logits(f->two, f->tok, SEQ_LEN, chunks, n);
    assert_non_null(l);
    expect_rows(f, l, f->ref, 0, SEQ_LEN, "2 GPUs, random chunks");
    free(l);
}

static void batched(fixture *f) {
    dsv4_error err;
    dsv4_seq *a, *b;
    if (dsv4_seq_new(f->two, &a, &err) || dsv4_seq_new(f->two, &b, &err)) fail_msg("%s", err.msg);
    float *la = malloc(rows(f, SEQ_LEN)), *lb = malloc(rows(f, SEQ_LEN));
    int da = 0, db = 0, round = 0;
    while (da < SEQ_LEN || db < SEQ_LEN) {
        dsv4_step_item it[2];
        int n = 0;
        int ca = 1 + (round * 7) % 23, cb = round < 2 ? 0 : 1 + (round * 5) % 11;
        if (ca > SEQ_LEN - da) ca = SEQ_LEN - da;
        if (cb > SEQ_LEN - db) cb = SEQ_LEN - db;
        if (cb) it[n++] = (dsv4_step_item){ b, f->other + db, cb, DSV4_LOGITS_ALL, lb + (int64_t)db * f->vocab };
        if (ca) it[n++] = (dsv4_step_item){ a, f->tok + da, ca, DSV4_LOGITS_ALL, la + (int64_t)da * f->vocab };
        if (n && dsv4_step(f->two, it, n, &err)) fail_msg("batched step: %s", err.msg);
        da += ca;
        db += cb;
        round++;
    }
    expect_rows(f, la, f->ref, 0, SEQ_LEN, "2 GPUs, batched (first stream)");
    expect_rows(f, lb, f->ref_other, 0, SEQ_LEN, "2 GPUs, batched (second stream)");
    free(la);
    free(lb);
    dsv4_seq_free(a);
    dsv4_seq_free(b);
}

/* Saved on one model at k, restored on the other, continued there. */
static void save_across(fixture *f, dsv4_model *from, dsv4_model *to, const char *what) {
    static const int at[] = { 5, 10, 131 };
    dsv4_error err;
    float *l = malloc(rows(f, SEQ_LEN));
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        const int k = at[i];
        dsv4_seq *s, *r;
        if (dsv4_seq_new(from, &s, &err)) fail_msg("%s", err.msg);
        step1(from, s, f->tok, k, l);
        void *buf;
        size_t len;
        if (dsv4_seq_save_mem(s, &buf, &len, &err)) fail_msg("save: %s", err.msg);
        if (dsv4_seq_load_mem(to, buf, len, &r, &err)) fail_msg("load: %s", err.msg);
        step1(to, r, f->tok + k, SEQ_LEN - k, l + (int64_t)k * f->vocab);
        expect_rows(f, l, f->ref, k, SEQ_LEN, what);
        dsv4_seq_free(s);
        dsv4_seq_free(r);
        free(buf);
    }
    free(l);
}

static void rollback(fixture *f) {
    dsv4_error err;
    float *l = malloc(rows(f, SEQ_LEN)), *junk = malloc(rows(f, 16));
    int32_t bad[16];
    tm_tokens(bad, 16, f->vocab, 3);
    dsv4_seq *s;
    if (dsv4_seq_new(f->two, &s, &err)) fail_msg("%s", err.msg);
    dsv4_rng r;
    dsv4_rng_seed(&r, 11);
    int p = 0;
    while (p < SEQ_LEN) {
        const int k = 1 + (int)dsv4_rng_below(&r, 8), keep = (int)dsv4_rng_below(&r, (uint32_t)k + 1);
        if (p + k > SEQ_LEN) break;
        int32_t spec[16];
        for (int j = 0; j < k; j++) spec[j] = j < keep ? f->tok[p + j] : bad[j];
        dsv4_seq_snapshot *snap;
        if (dsv4_seq_snapshot_new(s, &snap, &err)) fail_msg("%s", err.msg);
        step1(f->two, s, spec, k, junk);
        if (keep && memcmp(junk, f->ref + (int64_t)p * f->vocab, rows(f, keep))) fail_msg("speculative step at %d: kept rows differ", p);
        if (dsv4_seq_rollback(s, snap, keep, &err)) fail_msg("rollback: %s", err.msg);
        dsv4_seq_snapshot_free(snap);
        p += keep;
        if (p < SEQ_LEN) {
            step1(f->two, s, f->tok + p, 1, l + (int64_t)p * f->vocab);
            expect_rows(f, l, f->ref, p, p + 1, "2 GPUs, after rollback");
            p++;
        }
    }
    dsv4_seq_free(s);
    free(l);
    free(junk);
}

static void ep_parity(void **state) {
    fixture *f = *state;
    one_shot_and_chunks(f);
    batched(f);
    save_across(f, f->two, f->one, "saved on 2 GPUs, continued on 1");
    save_across(f, f->one, f->two, "saved on 1 GPU, continued on 2");
    rollback(f);
}

#define SETUP(i) static int setup_##i(void **s) { return setup(s, &topologies[i]); }
SETUP(0) SETUP(1) SETUP(2) SETUP(3)

/* GPU 1 nearly full: the 2-GPU load fails naming GPU 1, and once it is free again the load works. */
static void a_full_gpu_fails_cleanly(void **state) {
    (void)state;
    const topology *tp = &topologies[0];
    char dir[256];
    dsv4_model *one = tm_make_on(tp->preset, tp->sets, tp->n_sets, 99, tp->mode, DSV4_DEVICE_CUDA, tp->kv, dir);
    assert_non_null(one);
    dsv4_model_free(one);
    dsv4_error err;
    assert_int_equal(cu_select(1, &err), 0);
    void *hog[4096];
    int n = 0;
    size_t fb = 0, tb = 0;
    cu_mem_info(&fb, &tb);
    for (size_t chunk = (size_t)1 << 30; chunk >= ((size_t)1 << 20) && n < 4096;) {
        cu_mem_info(&fb, &tb);
        if (fb < ((size_t)64 << 20)) break;
        void *p = chunk < fb ? cu_malloc(chunk) : NULL;
        if (p) hog[n++] = p;
        else chunk /= 2;
    }
    cu_select(0, NULL);
    dsv4_model *two = load_on(dir, tp, 2, &err);
    if (two) fail_msg("a 2-GPU load with GPU 1 full succeeded");
    if (!strstr(err.msg, "GPU 1")) fail_msg("the error does not name GPU 1: %s", err.msg);
    printf("  (the error: %s)\n", err.msg);
    cu_select(1, NULL);
    for (int i = 0; i < n; i++) cu_free(hog[i]);
    cu_select(0, NULL);
    if (!(two = load_on(dir, tp, 2, &err))) fail_msg("a 2-GPU load after freeing GPU 1 failed: %s", err.msg);
    dsv4_model_free(two);
    tm_rmdir(dir);
}

int main(void) {
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu expert parallelism: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    if (cu_select(1, &why)) {
        printf("gpu expert parallelism: skipped, needs 2 GPUs: %s\n", why.msg);
        return 0;
    }
    cu_select(0, NULL);
    int (*setups[])(void **) = { setup_0, setup_1, setup_2, setup_3 };
    struct CMUnitTest tests[N_TOPO + 1];
    for (int i = 0; i < N_TOPO; i++) tests[i] = (struct CMUnitTest){ topologies[i].name, ep_parity, setups[i], teardown, NULL };
    tests[N_TOPO] = (struct CMUnitTest){ "a full GPU fails the load cleanly", a_full_gpu_fails_cleanly, NULL, NULL, NULL };
    return _cmocka_run_group_tests("gpu expert parallelism (memcmp against one GPU)", tests, N_TOPO + 1, NULL, NULL);
}
