/* Sequence state you can keep (issue 4, spec §15): save/restore, fork and atomic rollback are bit-exact in
 * EXACT mode (memcmp of logits and of serialised states), and every damaged or foreign state file is refused
 * with a clear error, leaving the target sequence unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "helpers/testmodel.h"
#include "state/persist.h"
#include "state/sequence.h"
#include <math.h>
#include "model/model.h"
#include "state/prefix_companion.h"
#include "state/prefix_disk.h"
#include "util/error.h"
#include <sys/stat.h>
#include <utime.h>

#define N 300   /* past two HCA rows (256) and far past the window (8) */

static const char *const FLASH_SETS[] = {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"};

typedef struct {
    dsv4_model *m;
    char dir[256];
    int vocab;
    int32_t tok[N];
    float *ref;          /* one-shot logits of the whole sequence */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->m = tm_make("flash-tiny", FLASH_SETS, 3, 1234, DSV4_MODE_EXACT, f->dir);
    if (!f->m) return -1;
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    tm_tokens(f->tok, N, f->vocab, 99);
    f->ref = tm_logits(f->m, f->tok, N, NULL, 0);
    if (!f->ref) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    free(f->ref);
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

/* ---- helpers --------------------------------------------------------------------------------------------- */

static void step_or_fail(fixture *f, dsv4_seq *s, const int32_t *tok, int n, float *logits) {
    if (n <= 0) return;
    dsv4_error err;
    dsv4_step_item it = { s, tok, n, logits ? DSV4_LOGITS_ALL : DSV4_LOGITS_NONE, logits };
    if (dsv4_step(f->m, &it, 1, &err)) fail_msg("step: %s", err.msg);
}

/* A sequence that has processed tok[0..s) in one call. */
static dsv4_seq *prefix_seq(fixture *f, int s) {
    dsv4_seq *q;
    dsv4_error err;
    if (dsv4_seq_new(f->m, &q, &err)) fail_msg("seq_new: %s", err.msg);
    step_or_fail(f, q, f->tok, s, NULL);
    return q;
}

static void *save_or_fail(const dsv4_seq *s, size_t *len) {
    void *buf;
    dsv4_error err;
    if (dsv4_seq_save_mem(s, &buf, len, &err)) fail_msg("save: %s", err.msg);
    assert_int_equal(*len, dsv4_seq_state_bytes(s));
    return buf;
}

/* Continue s from its position to N and compare every new position's logits with the one-shot reference. */
static void check_continuation(fixture *f, dsv4_seq *s, const char *what, int at) {
    const int64_t p = dsv4_seq_position(s);
    float *l = malloc(sizeof(float) * (size_t)(N - p) * (size_t)f->vocab + 1);
    step_or_fail(f, s, f->tok + p, (int)(N - p), l);
    for (int64_t t = p; t < N; t++)
        if (memcmp(l + (t - p) * f->vocab, f->ref + t * f->vocab, sizeof(float) * (size_t)f->vocab))
            fail_msg("%s at %d: position %lld differs from never having stopped", what, at, (long long)t);
    free(l);
}

/* Serialised state of s equals that of a sequence that processed tok[0..pos) in one call. */
static void check_state_equals_sequential(fixture *f, const dsv4_seq *s, const char *what) {
    const int p = (int)dsv4_seq_position(s);
    dsv4_seq *q = prefix_seq(f, p);
    size_t la, lb;
    void *a = save_or_fail(s, &la), *b = save_or_fail(q, &lb);
    if (la != lb || memcmp(a, b, la)) fail_msg("%s: serialised state at %d differs from the sequential one", what, p);
    free(a);
    free(b);
    dsv4_seq_free(q);
}

/* Every class of position: s < 4, each s mod 4, 127/128/129 on the ratio-128 layers, past the window. */
static const int SAVE_AT[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 126, 127, 128, 129, 130, 131, 255, 256, 257, 299};
/* DSV4_QUICK (the sanitizer run): every fourth save position. */
#define N_SAVE_AT ((int)(sizeof SAVE_AT / sizeof SAVE_AT[0]))
static int save_step(void) { return getenv("DSV4_QUICK") ? 4 : 1; }

/* ---- save / restore -------------------------------------------------------------------------------------- */

static void save_restore_continue(void **state) {
    fixture *f = *state;
    dsv4_error err;
    for (int i = 0; i < N_SAVE_AT; i += save_step()) {
        const int s = SAVE_AT[i];
        dsv4_seq *q = prefix_seq(f, s);
        size_t len;
        void *buf = save_or_fail(q, &len);
        dsv4_seq_free(q);
        dsv4_seq *r;
        if (dsv4_seq_load_mem(f->m, buf, len, &r, &err)) fail_msg("load at %d: %s", s, err.msg);
        assert_int_equal(dsv4_seq_position(r), s);
        /* save(load(x)) == x */
        size_t len2;
        void *buf2 = save_or_fail(r, &len2);
        if (len2 != len || memcmp(buf, buf2, len)) fail_msg("save(load(state at %d)) is not the same bytes", s);
        free(buf2);
        check_continuation(f, r, "load_mem", s);
        dsv4_seq_free(r);
        free(buf);
    }
}

/* Through a file, and into an existing sequence that already holds other state. */
static void save_file_restore_existing(void **state) {
    fixture *f = *state;
    dsv4_error err;
    char path[300];
    snprintf(path, sizeof path, "%s/state.bin", f->dir);
    for (int i = 0; i < N_SAVE_AT; i += 3) {
        const int s = SAVE_AT[i];
        dsv4_seq *q = prefix_seq(f, s);
        if (dsv4_seq_save(q, path, &err)) fail_msg("save file: %s", err.msg);
        dsv4_seq_free(q);
        dsv4_seq *r;
        if (dsv4_seq_load(f->m, path, &r, &err)) fail_msg("load file at %d: %s", s, err.msg);
        check_continuation(f, r, "file load", s);
        dsv4_seq_free(r);
        dsv4_seq *other = prefix_seq(f, 37);
        if (dsv4_seq_restore(other, path, &err)) fail_msg("restore at %d: %s", s, err.msg);
        assert_int_equal(dsv4_seq_position(other), s);
        check_continuation(f, other, "restore into existing", s);
        dsv4_seq_free(other);
    }
    /* no temporary file is left next to it */
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s/state.bin.tmp.%ld", f->dir, (long)getpid());
    assert_int_not_equal(access(tmp, F_OK), 0);
}

/* ---- fork -------------------------------------------------------------------------------------------------- */

static void fork_continue(void **state) {
    fixture *f = *state;
    dsv4_error err;
    for (int i = 0; i < N_SAVE_AT; i += save_step()) {
        const int s = SAVE_AT[i];
        dsv4_seq *q = prefix_seq(f, s), *c;
        if (dsv4_seq_fork(q, &c, &err)) fail_msg("fork: %s", err.msg);
        check_state_equals_sequential(f, c, "fork");
        check_continuation(f, c, "fork", s);          /* the fork continues ... */
        check_continuation(f, q, "fork origin", s);   /* ... and so does the original, independently */
        dsv4_seq_free(c);
        dsv4_seq_free(q);
    }
}

/* Forks share their parent's append-only rows copy-on-write. The hazard: a sharer that rolls back below the
 * fork point and then appends rewrites rows the others still read. Here the parent snapshots 9 tokens before
 * the fork point, forks, rolls back past it and takes another path (rewriting ratio-4 rows that the children
 * hold); a grandchild appends too; the children must continue exactly as never forked, in any freeing order. */
static void fork_copy_on_write(void **state) {
    fixture *f = *state;
    dsv4_error err;
    const int at = 130, back = 9;
    dsv4_seq *q = prefix_seq(f, at - back), *c, *g;
    dsv4_seq_snapshot *snap;
    if (dsv4_seq_snapshot_new(q, &snap, &err)) fail_msg("snapshot: %s", err.msg);
    step_or_fail(f, q, f->tok + at - back, back, NULL);
    if (dsv4_seq_fork(q, &c, &err) || dsv4_seq_fork(c, &g, &err)) fail_msg("fork: %s", err.msg);
    if (dsv4_seq_rollback(q, snap, 0, &err)) fail_msg("rollback: %s", err.msg);
    dsv4_seq_snapshot_free(snap);
    int32_t other[60];
    for (int j = 0; j < 60; j++) other[j] = (f->tok[at - back + j] + 7 + j) % f->vocab;
    step_or_fail(f, q, other, 60, NULL);              /* rows from (at-back)/4 on, rewritten */
    step_or_fail(f, g, other, 5, NULL);               /* the grandchild appends its own */
    dsv4_seq_free(q);                                 /* the parent goes first */
    check_state_equals_sequential(f, c, "cow child");
    check_continuation(f, c, "cow child", at);
    dsv4_seq_free(c);
    dsv4_seq_free(g);
}

/* ---- rollback ---------------------------------------------------------------------------------------------- */

/* From p0, speculate k tokens of which the first `good` are the true ones, roll back to keep, continue. */
static void rollback_case(fixture *f, int p0, int k, int keep, int good) {
    dsv4_error err;
    dsv4_seq *q = prefix_seq(f, p0);
    dsv4_seq_snapshot *snap;
    if (dsv4_seq_snapshot_new(q, &snap, &err)) fail_msg("snapshot: %s", err.msg);
    int32_t spec[64];
    for (int j = 0; j < k; j++) spec[j] = j < good ? f->tok[p0 + j] : (f->tok[p0 + j] + 1 + j) % f->vocab;
    step_or_fail(f, q, spec, k, NULL);
    if (dsv4_seq_rollback(q, snap, keep, &err)) fail_msg("rollback p0 %d k %d keep %d: %s", p0, k, keep, err.msg);
    assert_int_equal(dsv4_seq_position(q), p0 + keep);
    char what[96];
    snprintf(what, sizeof what, "rollback p0 %d k %d keep %d", p0, k, keep);
    check_state_equals_sequential(f, q, what);
    check_continuation(f, q, what, p0 + keep);
    dsv4_seq_snapshot_free(snap);
    dsv4_seq_free(q);
}

static void rollback_every_a(void **state) {
    fixture *f = *state;
    static const int P0[] = {0, 3, 126, 127, 254};
    static const int K[] = {5, 16};   /* 16 = the default max_spec: the whole ring slack */
    for (size_t i = 0; i < sizeof P0 / sizeof P0[0]; i++)
        for (size_t j = 0; j < sizeof K / sizeof K[0]; j++)
            for (int a = 0; a <= K[j]; a++) {
                if (P0[i] + K[j] > N) continue;
                if (getenv("DSV4_QUICK") && K[j] == 16) continue;   /* the sanitizer run: k = 5 only */
                rollback_case(f, P0[i], K[j], a, a);
            }
}

static void rollback_refusals(void **state) {
    fixture *f = *state;
    dsv4_error err;
    dsv4_seq *q = prefix_seq(f, 20), *other = prefix_seq(f, 20);
    dsv4_seq_snapshot *snap;
    if (dsv4_seq_snapshot_new(q, &snap, &err)) fail_msg("snapshot: %s", err.msg);
    /* keep > k */
    assert_int_equal(dsv4_seq_rollback(q, snap, 1, &err), DSV4_E_ARG);
    assert_int_equal(dsv4_seq_rollback(q, snap, -1, &err), DSV4_E_ARG);
    /* another sequence */
    assert_int_equal(dsv4_seq_rollback(other, snap, 0, &err), DSV4_E_ARG);
    /* k > max_spec (16): refused, sequence unchanged; committing all of them is still fine */
    step_or_fail(f, q, f->tok + 20, 17, NULL);
    size_t la, lb;
    void *before = save_or_fail(q, &la);
    assert_int_equal(dsv4_seq_rollback(q, snap, 3, &err), DSV4_E_STATE);
    assert_non_null(strstr(err.msg, "max_spec"));
    assert_null(strchr(err.msg, '\n'));
    void *after = save_or_fail(q, &lb);
    assert_true(la == lb && !memcmp(before, after, la));
    assert_int_equal(dsv4_seq_rollback(q, snap, 17, &err), 0);
    check_continuation(f, q, "commit all 17", 37);
    free(before);
    free(after);
    dsv4_seq_snapshot_free(snap);
    dsv4_seq_free(q);
    dsv4_seq_free(other);
}

/* ---- corruption ------------------------------------------------------------------------------------------ */

/* Loading `buf` must fail with a one-line message, and restoring into `target` must leave it unchanged. */
static void expect_refused(fixture *f, const void *buf, size_t len, dsv4_seq *target, const void *target_state,
                           size_t target_len, const char *what) {
    dsv4_error err;
    dsv4_seq *r = NULL;
    int rc = dsv4_seq_load_mem(f->m, buf, len, &r, &err);
    if (rc == 0) fail_msg("%s: load accepted a damaged state", what);
    if (rc != DSV4_E_FORMAT && rc != DSV4_E_STATE) fail_msg("%s: unexpected error code %d (%s)", what, rc, err.msg);
    if (!err.msg[0] || strchr(err.msg, '\n')) fail_msg("%s: message is not one line: '%s'", what, err.msg);
    assert_null(r);
    if (dsv4_seq_restore_mem(target, buf, len, &err) == 0) fail_msg("%s: restore accepted a damaged state", what);
    size_t l2;
    void *now = save_or_fail(target, &l2);
    if (l2 != target_len || memcmp(now, target_state, l2)) fail_msg("%s: the target sequence changed", what);
    free(now);
}

static void corruption(void **state) {
    fixture *f = *state;
    dsv4_seq *q = prefix_seq(f, 131), *target = prefix_seq(f, 50);
    size_t len, tlen;
    uint8_t *good = save_or_fail(q, &len), *tstate = save_or_fail(target, &tlen);
    uint8_t *bad = malloc(len + 16);
    char what[80];
    /* one flipped byte: every header byte, then a stride through tokens and every layer, then the checksum */
    int tried = 0;
    for (size_t off = 0; off < len; off += off < 128 ? 1 : off + 8 >= len ? 1 : 211) {
        memcpy(bad, good, len);
        bad[off] ^= (uint8_t)(1u << (off % 8));
        snprintf(what, sizeof what, "byte %zu flipped", off);
        expect_refused(f, bad, len, target, tstate, tlen, what);
        tried++;
    }
    assert_true(tried > 128);
    /* truncation at every interesting length, and trailing garbage */
    const size_t cuts[] = {0, 1, 8, 11, 12, 40, 55, 56, 57, 61, 62, 300, len / 2, len - 9, len - 8, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        snprintf(what, sizeof what, "truncated to %zu bytes", cuts[i]);
        expect_refused(f, good, cuts[i], target, tstate, tlen, what);
    }
    memcpy(bad, good, len);
    bad[len] = 0;
    expect_refused(f, bad, len + 1, target, tstate, tlen, "one trailing byte");
    /* a format version this build does not know (a newer one): refused by name */
    dsv4_error err;
    dsv4_seq *r;
    memcpy(bad, good, len);
    bad[8] = (uint8_t)(PERSIST_VERSION + 1);
    assert_int_equal(dsv4_seq_load_mem(f->m, bad, len, &r, &err), DSV4_E_FORMAT);
    snprintf(what, sizeof what, "version %u", PERSIST_VERSION + 1);
    assert_non_null(strstr(err.msg, what));
    /* not a state at all */
    assert_int_equal(dsv4_seq_load_mem(f->m, "hello world, not a state file at all........................", 60, &r, &err),
                     DSV4_E_FORMAT);
    assert_non_null(strstr(err.msg, "magic"));
    /* a missing file */
    assert_int_equal(dsv4_seq_load(f->m, "/nonexistent/dir/state.bin", &r, &err), DSV4_E_IO);
    free(bad);
    free(good);
    free(tstate);
    dsv4_seq_free(q);
    dsv4_seq_free(target);
}

/* Another config (window 16), another mode: clear DSV4_E_STATE errors. */
static void foreign_model(void **state) {
    fixture *f = *state;
    dsv4_seq *q = prefix_seq(f, 40);
    size_t len;
    void *buf = save_or_fail(q, &len);
    dsv4_error err;
    dsv4_seq *r = NULL;
    char dir[256];
    static const char *const SETS16[] = {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=16", "index_topk=3"};
    dsv4_model *m2 = tm_make("flash-tiny", SETS16, 3, 1234, DSV4_MODE_EXACT, dir);
    assert_non_null(m2);
    assert_int_equal(dsv4_seq_load_mem(m2, buf, len, &r, &err), DSV4_E_STATE);
    assert_non_null(strstr(err.msg, "another model"));
    assert_null(r);
    dsv4_model_free(m2);
    tm_rmdir(dir);
    dsv4_model *m3 = tm_make("flash-tiny", FLASH_SETS, 3, 1234, DSV4_MODE_OFFICIAL, dir);
    assert_non_null(m3);
    assert_int_equal(dsv4_seq_load_mem(m3, buf, len, &r, &err), DSV4_E_STATE);
    assert_non_null(strstr(err.msg, "mode"));
    dsv4_model_free(m3);
    tm_rmdir(dir);
    free(buf);
    dsv4_seq_free(q);
}


/* ---- prefix cache ------------------------------------------------------------------------------------------ */

static void prefix_cache(void **state) {
    fixture *f = *state;
    dsv4_error err;
    dsv4_prefix_cache *c;
    dsv4_prefix_cache_stats st;
    /* budget for two states of ~200 tokens: the third put evicts the least recently used */
    dsv4_seq *a = prefix_seq(f, 5), *b = prefix_seq(f, 130), *d = prefix_seq(f, 201);
    const size_t budget = dsv4_seq_state_bytes(b) + dsv4_seq_state_bytes(d) + 16;
    assert_int_equal(dsv4_prefix_cache_new(budget, &c, &err), 0);
    assert_int_equal(dsv4_prefix_cache_put(c, a, &err), 0);
    assert_int_equal(dsv4_prefix_cache_put(c, b, &err), 0);
    assert_int_equal(dsv4_prefix_cache_put(c, b, &err), 0);   /* same history: stored once */
    dsv4_prefix_cache_get_stats(c, &st);
    assert_int_equal(st.entries, 2);
    /* longest prefix wins; processing the rest equals a cold run (mid compressor chunk: 130 mod 4 = 2) */
    dsv4_seq *q;
    int64_t got;
    assert_int_equal(dsv4_prefix_cache_lookup(c, f->m, f->tok, N, &q, &got, &err), 0);
    assert_int_equal(got, 130);
    check_continuation(f, q, "prefix cache hit", 130);
    dsv4_seq_free(q);
    /* a request shorter than the longest entry gets the shorter one */
    assert_int_equal(dsv4_prefix_cache_lookup(c, f->m, f->tok, 100, &q, &got, &err), 0);
    assert_int_equal(got, 5);
    dsv4_seq_free(q);
    /* a request with another first token misses and gets a fresh sequence */
    int32_t other[N];
    memcpy(other, f->tok, sizeof other);
    other[0] = (other[0] + 1) % f->vocab;
    assert_int_equal(dsv4_prefix_cache_lookup(c, f->m, other, N, &q, &got, &err), 0);
    assert_int_equal(got, 0);
    assert_int_equal(dsv4_seq_position(q), 0);
    dsv4_seq_free(q);
    /* the lookup of 100 tokens touched a (5) after b (130): b is now the least recently used, so putting
     * d (201) evicts b and keeps a */
    assert_int_equal(dsv4_prefix_cache_put(c, d, &err), 0);
    dsv4_prefix_cache_get_stats(c, &st);
    assert_true(st.bytes <= st.budget);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.entries, 2);
    assert_int_equal(dsv4_prefix_cache_lookup(c, f->m, f->tok, N, &q, &got, &err), 0);
    assert_int_equal(got, 201);
    check_continuation(f, q, "prefix cache hit after eviction", 201);
    dsv4_seq_free(q);
    assert_int_equal(dsv4_prefix_cache_lookup(c, f->m, f->tok, 150, &q, &got, &err), 0);
    assert_int_equal(got, 5);   /* b (130) is gone */
    check_state_equals_sequential(f, q, "prefix cache fork");
    dsv4_seq_free(q);
    dsv4_prefix_cache_get_stats(c, &st);
    assert_int_equal(st.hits, 4);
    assert_int_equal(st.misses, 1);
    /* a state bigger than the whole budget is simply not cached */
    dsv4_prefix_cache *tiny;
    assert_int_equal(dsv4_prefix_cache_new(100, &tiny, &err), 0);
    assert_int_equal(dsv4_prefix_cache_put(tiny, b, &err), 0);
    dsv4_prefix_cache_get_stats(tiny, &st);
    assert_int_equal(st.entries, 0);
    dsv4_prefix_cache_free(tiny);
    dsv4_prefix_cache_free(c);
    dsv4_seq_free(a);
    dsv4_seq_free(b);
    dsv4_seq_free(d);
}

/* Companions (a speculative drafter's state stored with an entry, prefix_companion.h): charged to the budget with
 * their entry, one per kind, found only by lookups of their kind, never served from disk, freed exactly once
 * (when refused, evicted, or with the cache). */
typedef struct {
    prefix_companion base;
    int *frees;
    uint64_t value;   /* the payload on disk */
} test_comp;

static void test_comp_free(prefix_companion *p) {
    (*((test_comp *)p)->frees)++;
    free(p);
}

static prefix_companion *comp_new(const char *kind, size_t bytes, int *frees) {
    test_comp *c = calloc(1, sizeof *c);
    assert_non_null(c);
    c->base = (prefix_companion){ .kind = kind, .bytes = bytes, .free = test_comp_free };
    c->frees = frees;
    return &c->base;
}

static void prefix_cache_companions(void **state) {
    fixture *f = *state;
    dsv4_error err;
    dsv4_prefix_cache *c;
    dsv4_prefix_cache_stats st;
    dsv4_seq *a = prefix_seq(f, 5), *b = prefix_seq(f, 130), *d = prefix_seq(f, 201);
    const size_t sa = dsv4_seq_state_bytes(a), sb = dsv4_seq_state_bytes(b), sd = dsv4_seq_state_bytes(d);
    int frees = 0;
    /* room for a and b with their companions, or for b and d, not for all three */
    const size_t budget = sb + 50 + sd + 16;
    assert_true(sa + 300 + sb + 50 <= budget);
    assert_int_equal(dsv4_prefix_cache_new(budget, &c, &err), 0);
    assert_int_equal(prefix_cache_put_with(c, a, comp_new("mtp", 100, &frees), &err), 0);
    assert_int_equal(dsv4_prefix_cache_put(c, b, &err), 0);                               /* no companion */
    assert_int_equal(prefix_cache_put_with(c, a, comp_new("mtp", 100, &frees), &err), 0); /* has one: refused */
    assert_int_equal(frees, 1);
    assert_int_equal(prefix_cache_put_with(c, a, comp_new("dspark", 200, &frees), &err), 0); /* another kind */
    dsv4_prefix_cache_get_stats(c, &st);
    assert_int_equal(st.entries, 2);
    assert_int_equal(st.bytes, sa + sb + 300);
    /* the longest entry is b, but only a carries an "mtp" companion; a plain lookup takes b */
    dsv4_seq *q;
    int64_t got;
    const prefix_companion *pc;
    assert_int_equal(prefix_cache_lookup_with(c, f->m, f->tok, N, "mtp", NULL, &q, &got, &pc, &err), 0);
    assert_int_equal(got, 5);
    assert_non_null(pc);
    assert_string_equal(pc->kind, "mtp");
    assert_int_equal(pc->bytes, 100);
    dsv4_seq_free(q);
    assert_int_equal(prefix_cache_lookup_with(c, f->m, f->tok, N, "dspark", NULL, &q, &got, &pc, &err), 0);
    assert_true(got == 5 && pc && pc->bytes == 200);
    dsv4_seq_free(q);
    assert_int_equal(prefix_cache_lookup_with(c, f->m, f->tok, N, "self", NULL, &q, &got, &pc, &err), 0);
    assert_true(got == 0 && !pc);
    dsv4_seq_free(q);
    assert_int_equal(prefix_cache_lookup_with(c, f->m, f->tok, N, NULL, NULL, &q, &got, &pc, &err), 0);
    assert_true(got == 130 && !pc);
    dsv4_seq_free(q);
    /* b gets one later (an equal history put by a speculating stream) */
    assert_int_equal(prefix_cache_put_with(c, b, comp_new("mtp", 50, &frees), &err), 0);
    assert_int_equal(prefix_cache_lookup_with(c, f->m, f->tok, N, "mtp", NULL, &q, &got, &pc, &err), 0);
    assert_true(got == 130 && pc && pc->bytes == 50);
    dsv4_seq_free(q);
    /* a companion that cannot fit beside its entry is refused; putting d evicts the least recently used (a) with
     * both its companions */
    assert_int_equal(prefix_cache_put_with(c, d, comp_new("mtp", budget, &frees), &err), 0);
    dsv4_prefix_cache_get_stats(c, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(frees, 1 + 2 + 1);
    assert_int_equal(st.bytes, sb + 50 + sd);
    assert_true(st.bytes <= st.budget);
    dsv4_prefix_cache_free(c);
    assert_int_equal(frees, 5);
    dsv4_seq_free(a);
    dsv4_seq_free(b);
    dsv4_seq_free(d);
}

/* Companions on the disk tier (prefix_companion.h): a companion with a codec is written beside its state
 * (p-...-<hash>.<kind>.dsv4comp), a fresh cache (another process, or a restart) finds the entry only when it has
 * that companion and gets it decoded, also when memory cannot keep it (borrowed until the next call); eviction
 * removes a companion whose state is gone first, and a state with its companions. */
static int disk_frees;

static int tc_encode(const prefix_companion *p, void **buf, size_t *len, dsv4_error *err) {
    uint64_t *v = malloc(8);
    if (!v) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    *v = ((const test_comp *)p)->value;
    *buf = v;
    *len = 8;
    return 0;
}

static int tc_decode(dsv4_model *m, const int32_t *tokens, int64_t pos, const void *buf, size_t len, prefix_companion **out,
                     dsv4_error *err);
static const prefix_codec tc_codec = { "tst", tc_encode, tc_decode };

static int tc_decode(dsv4_model *m, const int32_t *tokens, int64_t pos, const void *buf, size_t len, prefix_companion **out,
                     dsv4_error *err) {
    if (len != 8) return dsv4_fail(err, DSV4_E_FORMAT, "test companion: %zu bytes", len);
    test_comp *c = calloc(1, sizeof *c);
    if (!c) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    c->base = (prefix_companion){ .kind = "tst", .bytes = 100, .free = test_comp_free, .codec = &tc_codec };
    c->frees = &disk_frees;
    memcpy(&c->value, buf, 8);
    *out = &c->base;
    return 0;
}

static prefix_companion *tc_new(uint64_t value, int *frees) {
    prefix_companion *p = comp_new("tst", 100, frees);
    p->codec = &tc_codec;
    ((test_comp *)p)->value = value;
    return p;
}

static int count_suffix(const char *dir, const char *suffix) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c -- '%s$'", dir, suffix);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) { if (fscanf(p, "%d", &n) != 1) n = -1; pclose(p); }
    return n;
}

static void set_age(const char *path, int seconds_ago) {
    struct utimbuf t = { time(NULL) - seconds_ago, time(NULL) - seconds_ago };
    assert_int_equal(utime(path, &t), 0);
}

static void prefix_cache_disk_companions(void **state) {
    fixture *f = *state;
    dsv4_error err;
    char dir[] = "/tmp/dsv4-test-pcache-XXXXXX";
    assert_non_null(mkdtemp(dir));
    dsv4_seq *a = prefix_seq(f, 130), *b = prefix_seq(f, 201), *d = prefix_seq(f, 260);
    const size_t big = 64 << 20;
    int frees = 0;
    disk_frees = 0;
    dsv4_prefix_cache *ca, *cb;
    assert_int_equal(dsv4_prefix_cache_new(big, &ca, &err), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(ca, dir, big, &err), 0);
    assert_int_equal(prefix_cache_put_with(ca, a, tc_new(0x1122334455667788ULL, &frees), &err), 0);
    assert_int_equal(dsv4_prefix_cache_put(ca, b, &err), 0);
    assert_int_equal(prefix_cache_put_with(ca, a, comp_new("mtp", 100, &frees), &err), 0);   /* no codec: memory only */
    assert_int_equal(count_suffix(dir, ".dsv4seq"), 2);
    assert_int_equal(count_suffix(dir, ".tst.dsv4comp"), 1);
    assert_int_equal(count_suffix(dir, ".dsv4comp"), 1);
    char comp_a[4300], state_a[4300];
    prefix_disk_companion_path(comp_a, sizeof comp_a, dir, f->m->fingerprint, f->tok, 130, "tst");
    prefix_disk_state_path(state_a, sizeof state_a, dir, f->m->fingerprint, f->tok, 130);
    assert_int_equal(access(comp_a, F_OK), 0);
    /* a restart: the longest entry with a "tst" companion is a, from disk, decoded */
    assert_int_equal(dsv4_prefix_cache_new(big, &cb, &err), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(cb, dir, big, &err), 0);
    dsv4_seq *q;
    int64_t got;
    const prefix_companion *pc;
    assert_int_equal(prefix_cache_lookup_with(cb, f->m, f->tok, N, "tst", &tc_codec, &q, &got, &pc, &err), 0);
    assert_int_equal(got, 130);
    assert_non_null(pc);
    assert_true(pc->codec == &tc_codec && ((const test_comp *)pc)->value == 0x1122334455667788ULL);
    check_continuation(f, q, "disk hit with a companion", 130);
    dsv4_seq_free(q);
    /* memory kept it with its companion: the next lookup of the kind is a memory hit */
    dsv4_prefix_cache_stats st;
    assert_int_equal(prefix_cache_lookup_with(cb, f->m, f->tok, N, "tst", &tc_codec, &q, &got, &pc, &err), 0);
    dsv4_prefix_cache_get_stats(cb, &st);
    assert_true(got == 130 && pc && st.disk_hits == 1 && st.hits == 2);
    dsv4_seq_free(q);
    /* "mtp" has no file: memory only, so a miss here; a plain lookup takes the longest state */
    assert_int_equal(prefix_cache_lookup_with(cb, f->m, f->tok, N, "mtp", NULL, &q, &got, &pc, &err), 0);
    assert_true(got == 0 && !pc);
    dsv4_seq_free(q);
    assert_int_equal(prefix_cache_lookup_with(cb, f->m, f->tok, N, NULL, NULL, &q, &got, &pc, &err), 0);
    assert_true(got == 201 && !pc);
    dsv4_seq_free(q);
    dsv4_prefix_cache_free(cb);
    assert_int_equal(disk_frees, 1);
    /* a cache without memory: the decoded companion is lent until the next call, then freed */
    assert_int_equal(dsv4_prefix_cache_new(0, &cb, &err), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(cb, dir, big, &err), 0);
    assert_int_equal(prefix_cache_lookup_with(cb, f->m, f->tok, N, "tst", &tc_codec, &q, &got, &pc, &err), 0);
    assert_true(got == 130 && pc && ((const test_comp *)pc)->value == 0x1122334455667788ULL);
    assert_int_equal(disk_frees, 1);
    dsv4_seq_free(q);
    assert_int_equal(dsv4_prefix_cache_lookup(cb, f->m, f->tok, N, &q, &got, &err), 0);
    assert_int_equal(disk_frees, 2);
    dsv4_seq_free(q);
    dsv4_prefix_cache_free(cb);
    /* eviction: an orphan companion (its state gone) goes first */
    char orphan[4300];
    prefix_disk_companion_path(orphan, sizeof orphan, dir, f->m->fingerprint, f->tok, 7, "tst");
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "head -c 100000 /dev/zero > %s", orphan);
    assert_int_equal(system(cmd), 0);
    struct stat sa_, sc_;
    assert_int_equal(stat(state_a, &sa_), 0);
    assert_int_equal(stat(comp_a, &sc_), 0);
    const size_t fits = (size_t)sa_.st_size + (size_t)sc_.st_size + dsv4_seq_state_bytes(b) + dsv4_seq_state_bytes(d) + 64;
    dsv4_prefix_cache *cm;
    assert_int_equal(dsv4_prefix_cache_new(0, &cm, &err), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(cm, dir, fits, &err), 0);
    assert_int_equal(dsv4_prefix_cache_put(cm, d, &err), 0);
    dsv4_prefix_cache_get_stats(cm, &st);
    assert_int_equal(st.disk_evictions, 1);
    assert_int_not_equal(access(orphan, F_OK), 0);
    assert_int_equal(access(comp_a, F_OK), 0);
    assert_true(st.disk_bytes <= fits);
    /* then the least recently used state, with its companion: a is the oldest, b and d stay */
    char state_b[4300], state_d[4300];
    prefix_disk_state_path(state_b, sizeof state_b, dir, f->m->fingerprint, f->tok, 201);
    prefix_disk_state_path(state_d, sizeof state_d, dir, f->m->fingerprint, f->tok, 260);
    set_age(state_a, 30);
    set_age(state_b, 20);
    set_age(state_d, 10);
    dsv4_seq *e = prefix_seq(f, 20);   /* room for it once a and its companion are gone */
    assert_int_equal(dsv4_prefix_cache_set_dir(cm, dir, dsv4_seq_state_bytes(b) + dsv4_seq_state_bytes(d) + dsv4_seq_state_bytes(e) + 64, &err), 0);
    assert_int_equal(dsv4_prefix_cache_put(cm, e, &err), 0);
    assert_int_not_equal(access(state_a, F_OK), 0);
    assert_int_not_equal(access(comp_a, F_OK), 0);
    assert_int_equal(access(state_b, F_OK), 0);
    assert_int_equal(access(state_d, F_OK), 0);
    assert_int_equal(count_suffix(dir, ".dsv4comp"), 0);
    dsv4_prefix_cache_free(cm);
    dsv4_prefix_cache_free(ca);
    assert_int_equal(frees, 2);
    dsv4_seq_free(a);
    dsv4_seq_free(b);
    dsv4_seq_free(d);
    dsv4_seq_free(e);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- sizes and speed (printed for the report) ------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Number of cache files in a folder. */
static int count_files(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s/*.dsv4seq 2>/dev/null | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) { if (fscanf(p, "%d", &n) != 1) n = -1; pclose(p); }
    return n;
}

/* The on-disk tier, as two processes would use it: cache A stores, a fresh cache B (empty memory) finds the
 * prefix on disk and continues exactly as a cold run; a damaged file is rejected, removed and recomputed; a
 * file of another model is never picked (its name carries the fingerprint), nor one misnamed for this model
 * (the state's own fingerprint check); the folder stays within its byte budget. */
static void prefix_cache_disk(void **state) {
    fixture *f = *state;
    dsv4_error err;
    char dir[] = "/tmp/dsv4-test-pcache-XXXXXX";
    assert_non_null(mkdtemp(dir));
    dsv4_seq *a = prefix_seq(f, 130), *b = prefix_seq(f, 201);
    const size_t budget = dsv4_seq_state_bytes(a) + dsv4_seq_state_bytes(b) + 64;
    dsv4_prefix_cache *ca, *cb;
    assert_int_equal(dsv4_prefix_cache_new(budget, &ca, &err), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(ca, dir, budget, &err), 0);
    assert_int_equal(dsv4_prefix_cache_put(ca, a, &err), 0);
    assert_int_equal(count_files(dir), 1);
    /* "another process": a new cache on the same folder */
    assert_int_equal(dsv4_prefix_cache_new(budget, &cb, &err), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(cb, dir, budget, &err), 0);
    dsv4_seq *q;
    int64_t got;
    assert_int_equal(dsv4_prefix_cache_lookup(cb, f->m, f->tok, N, &q, &got, &err), 0);
    assert_int_equal(got, 130);
    check_continuation(f, q, "disk prefix hit", 130);
    dsv4_seq_free(q);
    dsv4_prefix_cache_stats st;
    dsv4_prefix_cache_get_stats(cb, &st);
    assert_int_equal(st.disk_hits, 1);
    /* damage the file: flip one byte in the middle; a third cache (memory empty) rejects it and recomputes */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "f=$(ls %s/*.dsv4seq); printf '\\x55' | dd of=$f bs=1 seek=$(( $(stat -c %%s $f) / 2 )) "
             "conv=notrunc 2>/dev/null", dir);
    assert_int_equal(system(cmd), 0);
    dsv4_prefix_cache *cc;
    assert_int_equal(dsv4_prefix_cache_new(budget, &cc, &err), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(cc, dir, budget, &err), 0);
    assert_int_equal(dsv4_prefix_cache_lookup(cc, f->m, f->tok, N, &q, &got, &err), 0);
    assert_int_equal(got, 0);
    assert_int_equal(dsv4_seq_position(q), 0);
    dsv4_seq_free(q);
    dsv4_prefix_cache_get_stats(cc, &st);
    assert_int_equal(st.disk_rejected, 1);
    assert_int_equal(count_files(dir), 0);
    dsv4_prefix_cache_free(cc);
    /* putting the same state again stores the removed file again (memory already had it) */
    assert_int_equal(dsv4_prefix_cache_put(ca, a, &err), 0);
    assert_int_equal(count_files(dir), 1);
    /* a file of another model under this model's name: refused on load (fingerprint inside), removed */
    snprintf(cmd, sizeof cmd, "%s tiny -o %s/other --seed 9 --set sliding_window=16 >/dev/null",
             getenv("DSV4_BIN") ? getenv("DSV4_BIN") : "build/dsv4", dir);
    assert_int_equal(system(cmd), 0);
    dsv4_model *other;
    dsv4_load_opts lo = { .mode = DSV4_MODE_EXACT, .quiet = 1 };
    char odir[600];
    snprintf(odir, sizeof odir, "%s/other", dir);
    assert_int_equal(dsv4_model_load(odir, &lo, &other, &err), 0);
    dsv4_seq *os;
    assert_int_equal(dsv4_seq_new(other, &os, &err), 0);
    dsv4_step_item it = { os, f->tok, 130, DSV4_LOGITS_NONE, NULL };
    assert_int_equal(dsv4_step(other, &it, 1, &err), 0);
    snprintf(cmd, sizeof cmd, "%s/foreign.bin", dir);
    assert_int_equal(dsv4_seq_save(os, cmd, &err), 0);
    snprintf(cmd, sizeof cmd, "f=$(ls %s/*.dsv4seq); mv %s/foreign.bin $f", dir, dir);
    assert_int_equal(system(cmd), 0);
    dsv4_seq_free(os);
    dsv4_model_free(other);
    dsv4_prefix_cache_free(cb);   /* a fresh process again: nothing in memory */
    assert_int_equal(dsv4_prefix_cache_new(budget, &cb, &err), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(cb, dir, budget, &err), 0);
    assert_int_equal(dsv4_prefix_cache_lookup(cb, f->m, f->tok, N, &q, &got, &err), 0);
    assert_int_equal(got, 0);
    dsv4_seq_free(q);
    dsv4_prefix_cache_get_stats(cb, &st);
    assert_int_equal(st.disk_rejected, 1);
    /* the budget: three states where two fit; the least recently used file goes */
    dsv4_seq *d = prefix_seq(f, 260);
    const size_t small = dsv4_seq_state_bytes(b) + dsv4_seq_state_bytes(d) + 64;
    assert_int_equal(dsv4_prefix_cache_set_dir(ca, dir, small, &err), 0);
    dsv4_prefix_cache *cm;   /* a cache with no memory budget: every put reaches the disk */
    assert_int_equal(dsv4_prefix_cache_new(0, &cm, &err), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(cm, dir, small, &err), 0);
    assert_int_equal(dsv4_prefix_cache_put(cm, a, &err), 0);
    sleep(1);
    assert_int_equal(dsv4_prefix_cache_put(cm, b, &err), 0);
    sleep(1);
    assert_int_equal(dsv4_prefix_cache_put(cm, d, &err), 0);
    dsv4_prefix_cache_get_stats(cm, &st);
    assert_true(st.disk_bytes <= small);
    assert_true(st.disk_evictions >= 1);
    assert_int_equal(count_files(dir), 2);
    dsv4_prefix_cache_free(cm);
    dsv4_prefix_cache_free(ca);
    dsv4_prefix_cache_free(cb);
    dsv4_seq_free(a);
    dsv4_seq_free(b);
    dsv4_seq_free(d);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void sizes_and_speed(void **state) {
    fixture *f = *state;
    /* V4-Flash: 43 layers, 0/1 window-only, then CSA (4) on even and HCA (128) on odd; D 512, indexer 128. */
    persist_header h = { .version = 1, .n_layers = 43, .head_dim = 512, .index_head_dim = 128, .window = 128,
                         .ring_len = 144 };
    for (int L = 0; L < 43; L++) h.ratio[L] = L < 2 ? 0 : L % 2 == 0 ? 4 : 128;
    persist_sizes sz;
    const int64_t ctx[] = {0, 4096, 65536, 1048576};
    for (size_t i = 0; i < 4; i++) {
        h.pos = ctx[i];
        assert_int_equal(persist_sizes_of(&h, &sz), 0);
        printf("flash-shaped state at %7lld tokens: %10.2f MiB\n", (long long)ctx[i], (double)sz.total / 1048576.0);
    }
    printf("flash-shaped: fixed %.2f MiB, %.1f bytes per context token (fp32 rows + token id)\n",
           (double)sz.fixed / 1048576.0, sz.per_token);
    /* speed on the test model's state, repeated */
    dsv4_seq *q = prefix_seq(f, N);
    size_t len;
    void *buf = save_or_fail(q, &len);
    free(buf);
    const int reps = 200;
    double t0 = now_s();
    for (int i = 0; i < reps; i++) { buf = save_or_fail(q, &len); free(buf); }
    double t_save = now_s() - t0;
    buf = save_or_fail(q, &len);
    dsv4_error err;
    t0 = now_s();
    for (int i = 0; i < reps; i++) {
        dsv4_seq *r;
        if (dsv4_seq_load_mem(f->m, buf, len, &r, &err)) fail_msg("load: %s", err.msg);
        dsv4_seq_free(r);
    }
    double t_load = now_s() - t0;
    printf("tiny state %zu bytes: save_mem %.0f MB/s, load_mem (validate + fill) %.0f MB/s\n", len,
           (double)len * reps / t_save / 1e6, (double)len * reps / t_load / 1e6);
    free(buf);
    dsv4_seq_free(q);
}

/* bench --context's fast-forward: the counts a real prefix of n tokens leaves (position, compressed and indexer
 * rows per layer), a step works after it, and a sequence that is not empty is refused. */
static void fast_forward_counts(void **state) {
    fixture *f = *state;
    static const int ns[] = { 0, 3, 4, 131, 256, 300 };
    float *logits = malloc(sizeof(float) * (size_t)f->vocab);
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        dsv4_seq *a = prefix_seq(f, ns[i]), *b;
        dsv4_error err;
        if (dsv4_seq_new(f->m, &b, &err)) fail_msg("seq_new: %s", err.msg);
        if (seq_fast_forward_zero(b, ns[i], &err)) fail_msg("fast-forward %d: %s", ns[i], err.msg);
        assert_int_equal(a->pos, b->pos);
        for (int L = 0; L < a->n_layers; L++) {
            if (a->layer[L].crows.n != b->layer[L].crows.n || a->layer[L].irows.n != b->layer[L].irows.n)
                fail_msg("n = %d, layer %d: rows %lld/%lld vs %lld/%lld", ns[i], L, (long long)a->layer[L].crows.n,
                         (long long)a->layer[L].irows.n, (long long)b->layer[L].crows.n, (long long)b->layer[L].irows.n);
        }
        step_or_fail(f, b, f->tok, 1, logits);
        for (int v = 0; v < f->vocab; v++)
            if (!isfinite(logits[v])) fail_msg("n = %d: logit %d not finite after the fast-forward", ns[i], v);
        assert_int_equal(seq_fast_forward_zero(b, 10, &err), DSV4_E_STATE);
        dsv4_seq_free(a);
        dsv4_seq_free(b);
    }
    free(logits);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(save_restore_continue),
        cmocka_unit_test(save_file_restore_existing),
        cmocka_unit_test(fork_continue),
        cmocka_unit_test(fork_copy_on_write),
        cmocka_unit_test(rollback_every_a),
        cmocka_unit_test(rollback_refusals),
        cmocka_unit_test(corruption),
        cmocka_unit_test(foreign_model),
        cmocka_unit_test(fast_forward_counts),
        cmocka_unit_test(prefix_cache),
        cmocka_unit_test(prefix_cache_companions),
        cmocka_unit_test(prefix_cache_disk_companions),
        cmocka_unit_test(prefix_cache_disk),
        cmocka_unit_test(sizes_and_speed),
    };
    return cmocka_run_group_tests_name("sequence state (EXACT, memcmp)", tests, setup, teardown);
}
