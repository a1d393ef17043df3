/* Scheduler extensions for the server (issue 12), EXACT mode:
 *   - the per-request logits hook: called before every sampling with the tokens generated so far; a hook that
 *     bans the greedy choice changes exactly what it should (checked against a hand-driven reference loop that
 *     applies the same ban), a hook that leaves the row alone changes nothing, a failing hook finishes the
 *     request as ERROR without touching its neighbours;
 *   - the prefix cache inside the scheduler: a second request with the same prompt reuses n_prompt - 1 tokens,
 *     a follow-up whose prompt extends a finished stream's prompt + output reuses that final state, and every
 *     output equals the run without a cache (tm_greedy, one stream alone);
 *   - dsv4_sched_state_bytes is > 0 while streams run and 0 when none does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine/scheduler.h"
#include "helpers/testmodel.h"

typedef struct {
    dsv4_model *m;
    char dir[256];
    int vocab, eos;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    const char *sets[] = {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"};
    f->m = tm_make("flash-tiny", sets, 3, 99, DSV4_MODE_EXACT, f->dir);
    if (!f->m) return -1;
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    f->eos = info.eos_id;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

/* Run one request alone through a fresh scheduler; returns the number of tokens. */
static int run_one(dsv4_model *m, dsv4_prefix_cache *pc, const int32_t *prompt, int n, int max_new, dsv4_logits_hook hook,
                   int32_t *out, dsv4_finish *fin, int64_t *cached) {
    dsv4_sched *s = NULL;
    dsv4_sched_opts o = {4, 7};
    assert_int_equal(dsv4_sched_new(m, &o, &s, NULL), 0);
    if (pc) dsv4_sched_set_prefix_cache(s, pc);
    dsv4_request r = {.prompt = prompt, .n_prompt = n, .sampling = {0, 0, 1.0f, 0, 1}, .max_new_tokens = max_new, .hook = hook};
    int64_t id;
    assert_int_equal(dsv4_sched_add(s, &r, &id, NULL), 0);
    while (dsv4_sched_pending(s)) assert_int_equal(dsv4_sched_step(s, NULL), 0);
    dsv4_req_result res;
    assert_int_equal(dsv4_sched_result(s, id, &res, NULL), 0);
    memcpy(out, res.tokens, sizeof(int32_t) * (size_t)res.n_tokens);
    if (fin) *fin = res.finish;
    if (cached) *cached = res.n_cached;
    const int nt = res.n_tokens;
    dsv4_sched_free(s);
    return nt;
}

/* ---- the hook ------------------------------------------------------------------------------------------ */

typedef struct {
    int calls;
    int banned;          /* token id set to -inf at every call (-1: none) */
    int fail_at;         /* return an error when n_generated reaches it (-1: never) */
} hook_state;

static int test_hook(void *ctx, const int32_t *gen, int n_gen, float *logits, int vocab) {
    hook_state *h = ctx;
    (void)gen;
    h->calls++;
    if (h->fail_at >= 0 && n_gen >= h->fail_at) return 1;
    if (h->banned >= 0 && h->banned < vocab) logits[h->banned] = -INFINITY;
    return 0;
}

/* Reference for the ban: the same model, one sequence, argmax with the banned id excluded. */
static int greedy_banned(dsv4_model *m, int vocab, const int32_t *prompt, int n, int max_new, int banned, int32_t *out) {
    dsv4_seq *q = NULL;
    assert_int_equal(dsv4_seq_new(m, &q, NULL), 0);
    float *lg = malloc(sizeof(float) * (size_t)vocab);
    dsv4_step_item it = {q, prompt, n, DSV4_LOGITS_LAST, lg};
    assert_int_equal(dsv4_step(m, &it, 1, NULL), 0);
    for (int k = 0; k < max_new; k++) {
        int best = -1;
        for (int v = 0; v < vocab; v++)
            if (v != banned && (best < 0 || lg[v] > lg[best])) best = v;
        out[k] = best;
        dsv4_step_item d = {q, &out[k], 1, DSV4_LOGITS_LAST, lg};
        assert_int_equal(dsv4_step(m, &d, 1, NULL), 0);
    }
    free(lg);
    dsv4_seq_free(q);
    return max_new;
}

static void hook_changes_what_it_should(void **state) {
    fixture *f = *state;
    int32_t prompt[40], plain[16], want[16], got[16];
    tm_tokens(prompt, 40, f->vocab, 5);
    assert_int_equal(tm_greedy(f->m, prompt, 40, 12, plain), 0);
    /* a hook that only counts: same tokens, one call per sampled token */
    hook_state idle = {0, -1, -1};
    dsv4_finish fin;
    int n = run_one(f->m, NULL, prompt, 40, 12, (dsv4_logits_hook){test_hook, &idle}, got, &fin, NULL);
    assert_int_equal(n, 12);
    assert_memory_equal(got, plain, sizeof plain[0] * 12);
    assert_int_equal(idle.calls, 12);
    /* ban the first greedy token: the output follows the banned reference */
    hook_state ban = {0, plain[0], -1};
    n = run_one(f->m, NULL, prompt, 40, 12, (dsv4_logits_hook){test_hook, &ban}, got, &fin, NULL);
    greedy_banned(f->m, f->vocab, prompt, 40, 12, plain[0], want);
    assert_int_equal(n, 12);
    assert_memory_equal(got, want, sizeof want[0] * 12);
    assert_int_not_equal(got[0], plain[0]);
}

static void failing_hook_ends_only_its_request(void **state) {
    fixture *f = *state;
    int32_t a[30], b[30], ref[10];
    tm_tokens(a, 30, f->vocab, 11);
    tm_tokens(b, 30, f->vocab, 12);
    assert_int_equal(tm_greedy(f->m, b, 30, 8, ref), 0);
    dsv4_sched *s = NULL;
    dsv4_sched_opts o = {4, 0};
    assert_int_equal(dsv4_sched_new(f->m, &o, &s, NULL), 0);
    hook_state h = {0, -1, 3};
    dsv4_request ra = {.prompt = a, .n_prompt = 30, .sampling = {0, 0, 1.0f, 0, 1}, .max_new_tokens = 8, .hook = {test_hook, &h}};
    dsv4_request rb = {.prompt = b, .n_prompt = 30, .sampling = {0, 0, 1.0f, 0, 1}, .max_new_tokens = 8, .hook = {0}};
    int64_t ia, ib;
    assert_int_equal(dsv4_sched_add(s, &ra, &ia, NULL), 0);
    assert_int_equal(dsv4_sched_add(s, &rb, &ib, NULL), 0);
    while (dsv4_sched_pending(s)) assert_int_equal(dsv4_sched_step(s, NULL), 0);
    dsv4_req_result r;
    assert_int_equal(dsv4_sched_result(s, ia, &r, NULL), 0);
    assert_int_equal(r.finish, DSV4_FINISH_ERROR);
    assert_int_equal(r.n_tokens, 3);
    assert_int_equal(dsv4_sched_result(s, ib, &r, NULL), 0);
    assert_int_equal(r.finish, DSV4_FINISH_LENGTH);
    assert_memory_equal(r.tokens, ref, sizeof ref[0] * 8);
    dsv4_sched_free(s);
}

/* ---- the prefix cache ---------------------------------------------------------------------------------- */

static void prefix_cache_reuse_is_exact(void **state) {
    fixture *f = *state;
    dsv4_prefix_cache *pc = NULL;
    assert_int_equal(dsv4_prefix_cache_new((size_t)256 << 20, &pc, NULL), 0);
    int32_t p1[60], ref[12], got[12];
    tm_tokens(p1, 60, f->vocab, 21);
    assert_int_equal(tm_greedy(f->m, p1, 60, 10, ref), 0);
    int64_t cached = -1;
    int n = run_one(f->m, pc, p1, 60, 10, (dsv4_logits_hook){0}, got, NULL, &cached);
    assert_int_equal(n, 10);
    assert_int_equal(cached, 0);
    assert_memory_equal(got, ref, sizeof ref[0] * 10);
    /* the same prompt again: everything but the last token comes from the cache */
    n = run_one(f->m, pc, p1, 60, 10, (dsv4_logits_hook){0}, got, NULL, &cached);
    assert_int_equal(cached, 59);
    assert_memory_equal(got, ref, sizeof ref[0] * 10);
    /* a next turn: prompt + output + new tokens reuses the finished stream's final state (60 + 10 - 1) */
    int32_t p2[90], ref2[12];
    memcpy(p2, p1, sizeof p1);
    memcpy(p2 + 60, ref, sizeof ref[0] * 10);
    tm_tokens(p2 + 70, 20, f->vocab, 22);
    assert_int_equal(tm_greedy(f->m, p2, 90, 10, ref2), 0);
    n = run_one(f->m, pc, p2, 90, 10, (dsv4_logits_hook){0}, got, NULL, &cached);
    assert_int_equal(cached, 69);
    assert_memory_equal(got, ref2, sizeof ref2[0] * 10);
    dsv4_prefix_cache_free(pc);
}

static void state_bytes_follow_running_streams(void **state) {
    fixture *f = *state;
    int32_t p[20];
    tm_tokens(p, 20, f->vocab, 31);
    dsv4_sched *s = NULL;
    dsv4_sched_opts o = {2, 0};
    assert_int_equal(dsv4_sched_new(f->m, &o, &s, NULL), 0);
    assert_int_equal(dsv4_sched_state_bytes(s), 0);
    dsv4_request r = {.prompt = p, .n_prompt = 20, .sampling = {0, 0, 1.0f, 0, 1}, .max_new_tokens = 3, .hook = {0}};
    assert_int_equal(dsv4_sched_add(s, &r, NULL, NULL), 0);
    assert_int_equal(dsv4_sched_step(s, NULL), 0);
    assert_true(dsv4_sched_state_bytes(s) > 0);
    while (dsv4_sched_pending(s)) assert_int_equal(dsv4_sched_step(s, NULL), 0);
    assert_int_equal(dsv4_sched_state_bytes(s), 0);
    dsv4_sched_free(s);
}

/* A long-running server releases every result: the scheduler drops released records and ids stay valid. */
static void released_records_are_dropped(void **state) {
    fixture *f = *state;
    int32_t p[6], ref[2];
    tm_tokens(p, 6, f->vocab, 41);
    assert_int_equal(tm_greedy(f->m, p, 6, 2, ref), 0);
    dsv4_sched *s = NULL;
    dsv4_sched_opts o = {4, 0};
    assert_int_equal(dsv4_sched_new(f->m, &o, &s, NULL), 0);
    int64_t ids[8], first = -1;
    for (int round = 0; round < 60; round++) {
        /* a waiting request stays across rounds, so released records sit behind and ahead of live ones */
        for (int i = 0; i < 8; i++) {
            dsv4_request r = {.prompt = p, .n_prompt = 6, .sampling = {0, 0, 1.0f, 0, 1}, .max_new_tokens = 2, .hook = {0}};
            assert_int_equal(dsv4_sched_add(s, &r, &ids[i], NULL), 0);
            if (first < 0) first = ids[i];
        }
        while (dsv4_sched_pending(s)) assert_int_equal(dsv4_sched_step(s, NULL), 0);
        for (int i = 0; i < 8; i++) {
            dsv4_req_result res;
            assert_int_equal(dsv4_sched_result(s, ids[i], &res, NULL), 0);
            assert_int_equal(res.n_tokens, 2);
            assert_memory_equal(res.tokens, ref, sizeof ref);
            assert_int_equal(dsv4_sched_release(s, ids[i], NULL), 0);
        }
    }
    assert_int_equal(ids[7], 479);
    dsv4_req_result res;
    dsv4_error err;
    assert_int_not_equal(dsv4_sched_result(s, first, &res, &err), 0);   /* released long ago: unknown */
    assert_int_not_equal(dsv4_sched_result(s, 480, &res, &err), 0);     /* never issued */
    dsv4_sched_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hook_changes_what_it_should),
        cmocka_unit_test(failing_hook_ends_only_its_request),
        cmocka_unit_test(prefix_cache_reuse_is_exact),
        cmocka_unit_test(state_bytes_follow_running_streams),
        cmocka_unit_test(released_records_are_dropped),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
