/* Many streams in one step (DESIGN §2, issue 3), EXACT mode, memcmp:
 *   - the ragged dsv4_step: one stream prefilling 150 tokens next to five streams decoding one token each
 *     equals each stream alone;
 *   - the continuous-batching scheduler: every stream's sampled tokens and the logits they were drawn from
 *     equal the same stream run alone (one-shot prefill, then one token per step, its own sampler), whatever
 *     the neighbours, the insertion step, the slot it lands in, the token budget that chunks its prompt, and
 *     the cancellation of other streams.
 * Two topologies: flash-like [0,0,4,128,4,128] (window 8, index_topk 3) and pro-like [128,128,4,128]. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/scheduler.h"
#include "helpers/testmodel.h"

/* ---- fixture: one model per topology ------------------------------------------------------------------- */

typedef struct {
    const char *name, *preset;
    const char *sets[4];
    int n_sets;
} topology;

static const topology TOPOS[] = {
    {"flash-like", "flash-tiny", {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"}, 3},
    {"pro-like", "pro-tiny", {"compress_ratios=[128,128,4,128]", "sliding_window=8", "index_topk=5"}, 3},
};
#define N_TOPOS 2

/* DSV4_QUICK (the sanitizer run): the first topology only. */
static int n_topos(void) { return getenv("DSV4_QUICK") ? 1 : N_TOPOS; }

typedef struct {
    dsv4_model *m[N_TOPOS];
    char dir[N_TOPOS][256];
    int vocab[N_TOPOS], eos[N_TOPOS];
} fixture;

static int group_setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    for (int t = 0; t < N_TOPOS; t++) {
        f->m[t] = tm_make(TOPOS[t].preset, TOPOS[t].sets, TOPOS[t].n_sets, 4321 + t, DSV4_MODE_EXACT, f->dir[t]);
        if (!f->m[t]) return -1;
        dsv4_model_info info;
        dsv4_model_get_info(f->m[t], &info);
        f->vocab[t] = info.vocab_size;
        f->eos[t] = info.eos_id;
    }
    *state = f;
    return 0;
}

static int group_teardown(void **state) {
    fixture *f = *state;
    for (int t = 0; t < N_TOPOS && f; t++) {
        dsv4_model_free(f->m[t]);
        tm_rmdir(f->dir[t]);
    }
    free(f);
    return 0;
}

/* ---- streams: what to run and what came out ------------------------------------------------------------ */

typedef struct {
    int32_t prompt[400];
    int n_prompt, max_new, stop_on_eos;
    dsv4_sampling sp;
    int32_t stop[4];
    int n_stop;          /* tokens of the single stop sequence (0: none) */
} stream_spec;

typedef struct {
    int32_t tok[256];
    int n;
    float *logits;       /* [max_new][vocab]: the row each token was drawn from */
    dsv4_finish finish;
} stream_out;

/* A varied but deterministic stream: prompt length n, sampling kind by `kind`. */
static void make_spec(stream_spec *s, int n_prompt, int max_new, int vocab, uint64_t seed, int kind) {
    memset(s, 0, sizeof *s);
    assert_true(n_prompt <= 400 && max_new <= 256);
    s->n_prompt = n_prompt;
    s->max_new = max_new;
    s->stop_on_eos = 1;
    tm_tokens(s->prompt, n_prompt, vocab, seed);
    s->sp.top_p = 1.0f;
    s->sp.seed = seed * 7919 + 1;
    switch (kind % 4) {
    case 0: break; /* greedy */
    case 1: s->sp.temperature = 1.0f; break;
    case 2: s->sp.temperature = 0.8f; s->sp.top_k = 40; s->sp.top_p = 0.9f; break;
    case 3: s->sp.temperature = 1.3f; s->sp.min_p = 0.02f; break;
    }
}

static void out_init(stream_out *o, const stream_spec *s, int vocab) {
    memset(o, 0, sizeof *o);
    o->logits = malloc(sizeof(float) * (size_t)(s->max_new ? s->max_new : 1) * (size_t)vocab);
    assert_non_null(o->logits);
}

static int ends_with_stop(const stream_spec *s, const stream_out *o) {
    return s->n_stop && o->n >= s->n_stop && !memcmp(o->tok + o->n - s->n_stop, s->stop, sizeof(int32_t) * (size_t)s->n_stop);
}

/* The stream alone: its own sequence, the prompt in one call, then one token per call, its own sampler.
 * Same stop rules as the scheduler (EOS, then stop sequence, then length). */
static void run_alone(dsv4_model *m, int vocab, int eos, const stream_spec *s, stream_out *o) {
    out_init(o, s, vocab);
    o->finish = DSV4_FINISH_LENGTH;
    if (s->max_new == 0) return;
    dsv4_error err;
    dsv4_seq *seq;
    dsv4_sampler smp;
    assert_int_equal(dsv4_seq_new(m, &seq, &err), 0);
    assert_int_equal(dsv4_sampler_init(&smp, &s->sp, vocab, &err), 0);
    float *row = o->logits;
    dsv4_step_item it = { seq, s->prompt, s->n_prompt, DSV4_LOGITS_LAST, row };
    assert_int_equal(dsv4_step(m, &it, 1, &err), 0);
    for (;;) {
        const int32_t t = dsv4_sample(&smp, row);
        o->tok[o->n++] = t;
        if (s->stop_on_eos && t == eos) { o->finish = DSV4_FINISH_EOS; break; }
        if (ends_with_stop(s, o)) { o->finish = DSV4_FINISH_STOP; break; }
        if (o->n >= s->max_new) break;
        row = o->logits + (int64_t)o->n * vocab;
        dsv4_step_item d = { seq, &o->tok[o->n - 1], 1, DSV4_LOGITS_LAST, row };
        assert_int_equal(dsv4_step(m, &d, 1, &err), 0);
    }
    dsv4_sampler_free(&smp);
    dsv4_seq_free(seq);
}

/* ---- the scheduler driver ------------------------------------------------------------------------------ */

enum { CANCEL_NEVER = 0, CANCEL_IN_PREFILL = 1, CANCEL_IN_DECODE = 2 };

typedef struct {
    int add_step;        /* added just before this step */
    int cancel_step;     /* cancelled just before this step (when cancel != CANCEL_NEVER) */
    int cancel;          /* where the stream must be when cancelled */
} plan_item;

typedef struct {
    int vocab;
    stream_out *outs;
    int *stream_of_id;
} observer;

static void on_token(void *ctx, int64_t id, int index, int32_t token, const float *logits) {
    observer *ob = ctx;
    stream_out *o = &ob->outs[ob->stream_of_id[id]];
    assert_int_equal(index, o->n);
    o->tok[o->n++] = token;
    memcpy(o->logits + (int64_t)index * ob->vocab, logits, sizeof(float) * (size_t)ob->vocab);
}

typedef struct {
    int steps, max_running, max_T;
} run_stats;

static run_stats run_sched(dsv4_model *m, int vocab, int max_streams, int step_tokens, const stream_spec *specs,
                           const plan_item *plan, int n, stream_out *outs) {
    dsv4_error err;
    dsv4_sched *s;
    dsv4_sched_opts o = { max_streams, step_tokens };
    assert_int_equal(dsv4_sched_new(m, &o, &s, &err), 0);
    int64_t *id = calloc((size_t)n, sizeof *id);
    int *stream_of_id = calloc((size_t)n, sizeof *stream_of_id);
    observer ob = { vocab, outs, stream_of_id };
    dsv4_sched_set_observer(s, on_token, &ob);
    for (int i = 0; i < n; i++) out_init(&outs[i], &specs[i], vocab);
    run_stats st = {0};
    int added = 0;
    for (int step = 0; step < 100000; step++) {
        for (int i = 0; i < n; i++) {
            if (plan[i].add_step != step) continue;
            dsv4_stop_seq stop = { specs[i].stop, specs[i].n_stop };
            dsv4_request r = { specs[i].prompt, specs[i].n_prompt, specs[i].sp, specs[i].max_new,
                               specs[i].stop_on_eos, specs[i].n_stop ? &stop : NULL, specs[i].n_stop ? 1 : 0 };
            if (dsv4_sched_add(s, &r, &id[i], &err)) fail_msg("add: %s", err.msg);
            stream_of_id[id[i]] = i;
            added++;
        }
        for (int i = 0; i < n; i++) {
            if (plan[i].cancel == CANCEL_NEVER || plan[i].cancel_step != step || plan[i].add_step > step) continue;
            dsv4_req_result r;
            assert_int_equal(dsv4_sched_result(s, id[i], &r, &err), 0);
            if (r.state != DSV4_REQ_RUNNING) fail_msg("stream %d is not running when it is cancelled", i);
            if (plan[i].cancel == CANCEL_IN_PREFILL && !(r.n_prompt_done > 0 && r.n_prompt_done < specs[i].n_prompt))
                fail_msg("stream %d: not mid-prefill at cancel (%lld of %d)", i, (long long)r.n_prompt_done, specs[i].n_prompt);
            if (plan[i].cancel == CANCEL_IN_DECODE && r.n_tokens == 0) fail_msg("stream %d: not decoding at cancel", i);
            const int before = dsv4_sched_running(s);
            assert_int_equal(dsv4_sched_cancel(s, id[i], &err), 0);
            assert_int_equal(dsv4_sched_running(s), before - 1); /* state freed at once */
        }
        if (added == n && dsv4_sched_pending(s) == 0) break;
        if (dsv4_sched_step(s, &err)) fail_msg("step: %s", err.msg);
        st.steps++;
        if (dsv4_sched_running(s) > st.max_running) st.max_running = dsv4_sched_running(s);
        if (dsv4_sched_last_step_tokens(s) > st.max_T) st.max_T = dsv4_sched_last_step_tokens(s);
        if (step_tokens) assert_true(dsv4_sched_last_step_tokens(s) <= step_tokens);
        assert_true(dsv4_sched_running(s) <= max_streams);
    }
    assert_int_equal(dsv4_sched_pending(s), 0);
    for (int i = 0; i < n; i++) {
        dsv4_req_result r;
        assert_int_equal(dsv4_sched_result(s, id[i], &r, &err), 0);
        assert_int_equal(r.state, DSV4_REQ_DONE);
        assert_int_equal(r.n_tokens, outs[i].n);
        if (r.n_tokens && memcmp(r.tokens, outs[i].tok, sizeof(int32_t) * (size_t)r.n_tokens))
            fail_msg("stream %d: result tokens differ from the observed ones", i);
        outs[i].finish = r.finish;
        assert_int_equal(dsv4_sched_release(s, id[i], &err), 0);
    }
    dsv4_sched_free(s);
    free(id);
    free(stream_of_id);
    return st;
}

/* A batched stream equals the stream alone: same tokens, same logits rows (memcmp), same finish. A cancelled
 * stream's output is a prefix of the alone run. */
static void expect_same(const char *what, int i, const stream_out *got, const stream_out *ref, int vocab, int cancelled) {
    if (cancelled) {
        if (got->finish != DSV4_FINISH_CANCELLED) fail_msg("%s: stream %d finished as %s, not cancelled", what, i, dsv4_finish_name(got->finish));
        if (got->n > ref->n) fail_msg("%s: cancelled stream %d has more tokens than alone", what, i);
    } else {
        if (got->finish != ref->finish) fail_msg("%s: stream %d finished as %s, alone as %s", what, i,
                                                 dsv4_finish_name(got->finish), dsv4_finish_name(ref->finish));
        if (got->n != ref->n) fail_msg("%s: stream %d has %d tokens, alone %d", what, i, got->n, ref->n);
    }
    for (int k = 0; k < got->n; k++) {
        if (got->tok[k] != ref->tok[k]) fail_msg("%s: stream %d token %d: %d batched, %d alone", what, i, k, got->tok[k], ref->tok[k]);
        if (memcmp(got->logits + (int64_t)k * vocab, ref->logits + (int64_t)k * vocab, sizeof(float) * (size_t)vocab))
            fail_msg("%s: stream %d logits before token %d differ from alone", what, i, k);
    }
}

static void free_outs(stream_out *o, int n) {
    for (int i = 0; i < n; i++) free(o[i].logits);
}

/* Run specs through the scheduler with a plan and compare every stream with its alone run. */
static run_stats check_plan(fixture *f, int t, const char *what, int max_streams, int step_tokens, const stream_spec *specs,
                            const plan_item *plan, int n) {
    stream_out *ref = calloc((size_t)n, sizeof *ref), *got = calloc((size_t)n, sizeof *got);
    for (int i = 0; i < n; i++) run_alone(f->m[t], f->vocab[t], f->eos[t], &specs[i], &ref[i]);
    run_stats st = run_sched(f->m[t], f->vocab[t], max_streams, step_tokens, specs, plan, n, got);
    for (int i = 0; i < n; i++) expect_same(what, i, &got[i], &ref[i], f->vocab[t], plan[i].cancel != CANCEL_NEVER);
    free_outs(ref, n);
    free_outs(got, n);
    free(ref);
    free(got);
    return st;
}

/* ---- tests --------------------------------------------------------------------------------------------- */

/* The raw primitive: five streams already at positions 5, 9, 130, 200, 1 each decode one token in the same
 * step as a sixth stream prefills 150 tokens; every row equals the stream fed alone in one call. */
static void test_ragged_step(void **state) {
    fixture *f = *state;
    for (int t = 0; t < n_topos(); t++) {
        dsv4_model *m = f->m[t];
        const int V = f->vocab[t];
        static const int pre[5] = {5, 9, 130, 200, 1};
        int32_t tok[6][201];
        float *ref[6], *got[6];
        dsv4_seq *seq[6];
        dsv4_error err;
        dsv4_step_item items[6];
        for (int i = 0; i < 6; i++) {
            const int len = i < 5 ? pre[i] + 1 : 150;
            tm_tokens(tok[i], len, V, 500 + i);
            ref[i] = tm_logits(m, tok[i], len, NULL, 0);
            assert_non_null(ref[i]);
            got[i] = malloc(sizeof(float) * (size_t)len * (size_t)V);
            assert_int_equal(dsv4_seq_new(m, &seq[i], &err), 0);
        }
        /* bring the five decoders to their positions, together in one ragged prefill step */
        for (int i = 0; i < 5; i++) items[i] = (dsv4_step_item){ seq[i], tok[i], pre[i], DSV4_LOGITS_NONE, NULL };
        assert_int_equal(dsv4_step(m, items, 5, &err), 0);
        /* the step under test: the prefill in the middle of the item list */
        for (int i = 0, k = 0; i < 6; i++) {
            const int s = i == 2 ? 5 : i < 2 ? i : i - 1;   /* item order: d0 d1 P d2 d3 d4 */
            if (s == 5) items[k++] = (dsv4_step_item){ seq[5], tok[5], 150, DSV4_LOGITS_ALL, got[5] };
            else items[k++] = (dsv4_step_item){ seq[s], tok[s] + pre[s], 1, DSV4_LOGITS_LAST, got[s] };
        }
        assert_int_equal(dsv4_step(m, items, 6, &err), 0);
        for (int i = 0; i < 5; i++) {
            assert_int_equal(dsv4_seq_position(seq[i]), pre[i] + 1);
            if (memcmp(got[i], ref[i] + (int64_t)pre[i] * V, sizeof(float) * (size_t)V))
                fail_msg("%s: decoder at position %d differs from alone", TOPOS[t].name, pre[i]);
        }
        if (memcmp(got[5], ref[5], sizeof(float) * 150 * (size_t)V)) fail_msg("%s: the 150-token prefill differs from alone", TOPOS[t].name);
        for (int i = 0; i < 6; i++) { free(ref[i]); free(got[i]); dsv4_seq_free(seq[i]); }
    }
}

/* Mixed lengths (1 token to past 128 and past the window, prompts and generations crossing both), added at
 * staggered steps into 3 slots (so slots are reused), a budget of 16 tokens that chunks the long prompts. */
static void test_staggered_mixed(void **state) {
    fixture *f = *state;
    static const int lens[] = {1, 3, 8, 9, 17, 130, 200, 7, 120, 4};
    static const int news[] = {12, 6, 10, 3, 5, 8, 4, 20, 16, 1};
    enum { N = 10 };
    for (int t = 0; t < n_topos(); t++) {
        stream_spec sp[N];
        plan_item plan[N];
        for (int i = 0; i < N; i++) {
            make_spec(&sp[i], lens[i], news[i], f->vocab[t], 100 + i, i);
            plan[i] = (plan_item){ .add_step = 3 * i };
        }
        run_stats st = check_plan(f, t, "staggered", 3, 16, sp, plan, N);
        assert_int_equal(st.max_running, 3);
        /* and unlimited budget, one slot per stream */
        check_plan(f, t, "staggered unlimited", N, 0, sp, plan, N);
    }
}

/* Budgets that put prompt chunk boundaries at every offset mod 4 and around 128 (127, 128, 129), while a
 * neighbour decodes one token per step. */
static void test_chunk_offsets(void **state) {
    fixture *f = *state;
    static const int budgets[] = {2, 3, 4, 6, 8, 128, 129, 130};  /* chunks of 1,2,3,5,7,127,128,129 with the neighbour */
    for (int t = 0; t < n_topos(); t++) {
        stream_spec sp[2];
        make_spec(&sp[0], 3, 200, f->vocab[t], 11, 1);   /* the decoding neighbour */
        sp[0].stop_on_eos = 0;
        make_spec(&sp[1], 261, 6, f->vocab[t], 12, 2);   /* the chunked prompt */
        plan_item plan[2] = { {0, 0, 0}, {2, 0, 0} };
        for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
            char what[64];
            snprintf(what, sizeof what, "%s budget %d", TOPOS[t].name, budgets[b]);
            /* small chunk sizes on a shorter prompt (still past the window), to keep the run short */
            sp[1].n_prompt = budgets[b] < 10 ? 41 : 261;
            sp[0].max_new = budgets[b] < 10 ? 45 : 10;
            check_plan(f, t, what, 2, budgets[b], sp, plan, 2);
        }
    }
}

/* A stream's output does not depend on its neighbours: the same stream alone in the scheduler, with three
 * short neighbours, and with seven neighbours of long prompts under a tight budget, gives the same tokens and
 * logits (each compared with the alone run, hence with each other). */
static void test_neighbour_independence(void **state) {
    fixture *f = *state;
    for (int t = 0; t < n_topos(); t++) {
        stream_spec sp[8];
        plan_item plan[8];
        make_spec(&sp[0], 20, 14, f->vocab[t], 77, 1);
        plan[0] = (plan_item){ 0, 0, 0 };
        check_plan(f, t, "no neighbours", 4, 0, sp, plan, 1);
        for (int i = 1; i < 4; i++) {
            make_spec(&sp[i], 2 + i, 9, f->vocab[t], 200 + i, i);
            plan[i] = (plan_item){ i - 1, 0, 0 };
        }
        check_plan(f, t, "three short neighbours", 4, 0, sp, plan, 4);
        for (int i = 1; i < 8; i++) {
            make_spec(&sp[i], 60 + 23 * i, 5, f->vocab[t], 300 + i, i + 1);
            plan[i] = (plan_item){ i, 0, 0 };
        }
        check_plan(f, t, "seven long neighbours", 8, 24, sp, plan, 8);
    }
}

/* Cancel one stream mid-prefill and one mid-decode: the others are unchanged, the cancelled outputs are
 * prefixes of their alone runs, and waiting streams take the freed slots. */
static void test_cancel(void **state) {
    fixture *f = *state;
    enum { N = 6 };
    for (int t = 0; t < n_topos(); t++) {
        stream_spec sp[N];
        plan_item plan[N];
        make_spec(&sp[0], 10, 12, f->vocab[t], 40, 1);
        make_spec(&sp[1], 150, 8, f->vocab[t], 41, 2);   /* cancelled mid-prefill */
        make_spec(&sp[2], 6, 30, f->vocab[t], 42, 3);    /* cancelled mid-decode */
        make_spec(&sp[3], 33, 9, f->vocab[t], 43, 0);
        make_spec(&sp[4], 12, 7, f->vocab[t], 44, 1);    /* waits for a slot */
        make_spec(&sp[5], 140, 5, f->vocab[t], 45, 2);   /* waits for a slot */
        sp[0].stop_on_eos = sp[2].stop_on_eos = 0;
        for (int i = 0; i < N; i++) plan[i] = (plan_item){ 0, 0, 0 };
        plan[1] = (plan_item){ 0, 3, CANCEL_IN_PREFILL };
        plan[2] = (plan_item){ 0, 8, CANCEL_IN_DECODE };
        run_stats st = check_plan(f, t, "cancel", 4, 20, sp, plan, N);
        assert_int_equal(st.max_running, 4);
    }
}

/* 1, 2, 8 and 64 concurrent streams of short sequences, and 64 requests through 16 slots. */
static void test_many_streams(void **state) {
    fixture *f = *state;
    static const int counts[] = {1, 2, 8, 64};
    enum { NMAX = 64 };
    stream_spec *sp = calloc(NMAX, sizeof *sp);
    plan_item plan[NMAX];
    for (int t = 0; t < n_topos(); t++) {
        for (int i = 0; i < NMAX; i++) {
            make_spec(&sp[i], 1 + i % 12, 4 + i % 3, f->vocab[t], 1000 + i, i);
            /* no EOS stop: the slot counts below must not depend on which tokens happen to be drawn */
            sp[i].stop_on_eos = 0;
            plan[i] = (plan_item){ 0, 0, 0 };
        }
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            char what[64];
            snprintf(what, sizeof what, "%s, %d streams", TOPOS[t].name, counts[c]);
            run_stats st = check_plan(f, t, what, counts[c], 0, sp, plan, counts[c]);
            assert_int_equal(st.max_running, counts[c]);
        }
        for (int i = 0; i < NMAX; i++) plan[i].add_step = i / 8;
        run_stats st = check_plan(f, t, "64 requests through 16 slots", 16, 40, sp, plan, NMAX);
        assert_int_equal(st.max_running, 16);
    }
    free(sp);
}

/* Stop sequences, max_new_tokens 0, and invalid requests refused with an error (nothing aborts). */
static void test_stops_and_errors(void **state) {
    fixture *f = *state;
    const int t = 0, V = f->vocab[t];
    stream_spec sp[2];
    make_spec(&sp[0], 9, 20, V, 5, 1);
    sp[0].stop_on_eos = 0;
    stream_out alone;
    run_alone(f->m[t], V, f->eos[t], &sp[0], &alone);
    /* stop on the tokens the stream generates at indices 4..5: it must stop at the first occurrence */
    sp[0].stop[0] = alone.tok[4];
    sp[0].stop[1] = alone.tok[5];
    sp[0].n_stop = 2;
    free(alone.logits);
    make_spec(&sp[1], 4, 0, V, 6, 0);   /* max_new_tokens 0 */
    plan_item plan[2] = { {0, 0, 0}, {1, 0, 0} };
    stream_out got[2], ref;
    run_alone(f->m[t], V, f->eos[t], &sp[0], &ref);
    assert_int_equal(ref.finish, DSV4_FINISH_STOP);
    assert_true(ref.n <= 6);
    run_sched(f->m[t], V, 2, 0, sp, plan, 2, got);
    expect_same("stop sequence", 0, &got[0], &ref, V, 0);
    assert_int_equal(got[1].n, 0);
    assert_int_equal(got[1].finish, DSV4_FINISH_LENGTH);
    free(ref.logits);
    free_outs(got, 2);

    dsv4_sched *s;
    dsv4_error err;
    dsv4_sched_opts bad = { 0, 0 };
    assert_int_equal(dsv4_sched_new(f->m[t], &bad, &s, &err), DSV4_E_ARG);
    dsv4_sched_opts o = { 2, 0 };
    assert_int_equal(dsv4_sched_new(f->m[t], &o, &s, &err), 0);
    int32_t bad_tok[2] = { 3, V };
    dsv4_request r = { bad_tok, 2, { .top_p = 1.0f }, 4, 1, NULL, 0 };
    int64_t id;
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), DSV4_E_ARG);
    r.n_prompt = 0;
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), DSV4_E_ARG);
    r.n_prompt = 1;
    r.sampling.top_p = 0.0f;
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), DSV4_E_ARG);
    r.sampling.top_p = 1.0f;
    dsv4_stop_seq empty = { bad_tok, 0 };
    r.stop = &empty;
    r.n_stop = 1;
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), DSV4_E_ARG);
    r.n_stop = 0;
    assert_int_equal(dsv4_sched_cancel(s, 12345, &err), DSV4_E_ARG);
    dsv4_req_result res;
    assert_int_equal(dsv4_sched_result(s, -1, &res, &err), DSV4_E_ARG);
    /* a waiting request can be cancelled before it ever runs; releasing an unfinished one is refused */
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), 0);
    assert_int_equal(dsv4_sched_release(s, id, &err), DSV4_E_ARG);
    assert_int_equal(dsv4_sched_cancel(s, id, &err), 0);
    assert_int_equal(dsv4_sched_pending(s), 0);
    assert_int_equal(dsv4_sched_step(s, &err), 0);   /* nothing to do */
    assert_int_equal(dsv4_sched_last_step_tokens(s), 0);
    assert_int_equal(dsv4_sched_result(s, id, &res, &err), 0);
    assert_int_equal(res.finish, DSV4_FINISH_CANCELLED);
    assert_int_equal(res.n_tokens, 0);
    dsv4_sched_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ragged_step),
        cmocka_unit_test(test_staggered_mixed),
        cmocka_unit_test(test_chunk_offsets),
        cmocka_unit_test(test_neighbour_independence),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_many_streams),
        cmocka_unit_test(test_stops_and_errors),
    };
    /* BATCH_FILTER=test_cancel runs one test (cmocka glob) */
    if (getenv("BATCH_FILTER")) cmocka_set_test_filter(getenv("BATCH_FILTER"));
    return cmocka_run_group_tests_name("batch (EXACT, memcmp)", tests, group_setup, group_teardown);
}
