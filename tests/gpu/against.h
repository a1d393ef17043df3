/* Checks shared by the GPU tests that hold one model against reference logits (included, not linked: each test
 * program is one translation unit plus tests/unit/helpers). A model under test (m) runs the token sequences tok
 * and other (len tokens each) one-shot, token by token, in random chunks, batched beside each other, and through
 * speculative steps rolled back; every logits row must equal the reference rows (ref, ref_other) bit for bit.
 * save_across saves on one model and continues on another. */
#ifndef DSV4_TESTS_GPU_AGAINST_H
#define DSV4_TESTS_GPU_AGAINST_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "helpers/testmodel.h"
#include "model/tiny.h"

typedef struct {
    const char *label;            /* what the model under test is, for messages ("2 GPUs") */
    dsv4_model *m;
    int vocab, len;
    const int32_t *tok, *other;
    const float *ref, *ref_other; /* [len][vocab] each */
} against;

static inline size_t against_rows(const against *f, int n) { return sizeof(float) * (size_t)n * (size_t)f->vocab; }

static inline void against_expect_rows(const against *f, const float *got, const float *want, int from, int to, const char *what) {
    for (int p = from; p < to; p++)
        if (memcmp(got + (int64_t)p * f->vocab, want + (int64_t)p * f->vocab, against_rows(f, 1)))
            fail_msg("%s, %s: position %d differs from the reference", f->label, what, p);
}

static inline void against_step1(dsv4_model *m, dsv4_seq *s, const int32_t *t, int n, float *out) {
    dsv4_error err;
    dsv4_step_item it = { s, t, n, DSV4_LOGITS_ALL, out };
    if (dsv4_step(m, &it, 1, &err)) fail_msg("step: %s", err.msg);
}

static inline void against_one_shot_and_chunks(const against *f) {
    float *l = tm_logits(f->m, f->tok, f->len, NULL, 0);
    assert_non_null(l);
    against_expect_rows(f, l, f->ref, 0, f->len, "one shot");
    free(l);
    int one[1] = { 1 };
    l = tm_logits(f->m, f->tok, f->len, one, 1);
    assert_non_null(l);
    against_expect_rows(f, l, f->ref, 0, f->len, "token by token");
    free(l);
    dsv4_rng r;
    dsv4_rng_seed(&r, 5);
    int *chunks = malloc(sizeof(int) * (size_t)f->len), n = 0, sum = 0;
    while (sum < f->len) {
        const int c = 1 + (int)dsv4_rng_below(&r, 40);
        chunks[n++] = c;
        sum += c;
    }
    l = tm_logits(f->m, f->tok, f->len, chunks, n);
    assert_non_null(l);
    against_expect_rows(f, l, f->ref, 0, f->len, "random chunks");
    free(l);
    free(chunks);
}

static inline void against_batched(const against *f) {
    dsv4_error err;
    dsv4_seq *a, *b;
    if (dsv4_seq_new(f->m, &a, &err) || dsv4_seq_new(f->m, &b, &err)) fail_msg("%s", err.msg);
    float *la = malloc(against_rows(f, f->len)), *lb = malloc(against_rows(f, f->len));
    int da = 0, db = 0, round = 0;
    while (da < f->len || db < f->len) {
        dsv4_step_item it[2];
        int n = 0;
        int ca = 1 + (round * 7) % 23, cb = round < 2 ? 0 : 1 + (round * 5) % 11;
        if (ca > f->len - da) ca = f->len - da;
        if (cb > f->len - db) cb = f->len - db;
        if (cb) it[n++] = (dsv4_step_item){ b, f->other + db, cb, DSV4_LOGITS_ALL, lb + (int64_t)db * f->vocab };
        if (ca) it[n++] = (dsv4_step_item){ a, f->tok + da, ca, DSV4_LOGITS_ALL, la + (int64_t)da * f->vocab };
        if (n && dsv4_step(f->m, it, n, &err)) fail_msg("batched step: %s", err.msg);
        da += ca;
        db += cb;
        round++;
    }
    against_expect_rows(f, la, f->ref, 0, f->len, "batched (first stream)");
    against_expect_rows(f, lb, f->ref_other, 0, f->len, "batched (second stream)");
    free(la);
    free(lb);
    dsv4_seq_free(a);
    dsv4_seq_free(b);
}

/* Saved on one model at k, restored on the other, continued there. */
static inline void against_save_across(const against *f, dsv4_model *from, dsv4_model *to, const char *what) {
    static const int at[] = { 5, 10, 131 };
    dsv4_error err;
    float *l = malloc(against_rows(f, f->len));
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        const int k = at[i];
        dsv4_seq *s, *r;
        if (dsv4_seq_new(from, &s, &err)) fail_msg("%s", err.msg);
        against_step1(from, s, f->tok, k, l);
        void *buf;
        size_t len;
        if (dsv4_seq_save_mem(s, &buf, &len, &err)) fail_msg("save: %s", err.msg);
        if (dsv4_seq_load_mem(to, buf, len, &r, &err)) fail_msg("load: %s", err.msg);
        against_step1(to, r, f->tok + k, f->len - k, l + (int64_t)k * f->vocab);
        against_expect_rows(f, l, f->ref, k, f->len, what);
        dsv4_seq_free(s);
        dsv4_seq_free(r);
        free(buf);
    }
    free(l);
}

static inline void against_rollback(const against *f) {
    dsv4_error err;
    float *l = malloc(against_rows(f, f->len)), *junk = malloc(against_rows(f, 16));
    int32_t bad[16];
    tm_tokens(bad, 16, f->vocab, 3);
    dsv4_seq *s;
    if (dsv4_seq_new(f->m, &s, &err)) fail_msg("%s", err.msg);
    dsv4_rng r;
    dsv4_rng_seed(&r, 11);
    int p = 0;
    while (p < f->len) {
        const int k = 1 + (int)dsv4_rng_below(&r, 8), keep = (int)dsv4_rng_below(&r, (uint32_t)k + 1);
        if (p + k > f->len) break;
        int32_t spec[16];
        for (int j = 0; j < k; j++) spec[j] = j < keep ? f->tok[p + j] : bad[j];
        dsv4_seq_snapshot *snap;
        if (dsv4_seq_snapshot_new(s, &snap, &err)) fail_msg("%s", err.msg);
        against_step1(f->m, s, spec, k, junk);
        if (keep && memcmp(junk, f->ref + (int64_t)p * f->vocab, against_rows(f, keep))) fail_msg("speculative step at %d: kept rows differ", p);
        if (dsv4_seq_rollback(s, snap, keep, &err)) fail_msg("rollback: %s", err.msg);
        dsv4_seq_snapshot_free(snap);
        p += keep;
        if (p < f->len) {
            against_step1(f->m, s, f->tok + p, 1, l + (int64_t)p * f->vocab);
            against_expect_rows(f, l, f->ref, p, p + 1, "after rollback");
            p++;
        }
    }
    dsv4_seq_free(s);
    free(l);
    free(junk);
}

#endif
