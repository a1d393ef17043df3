/* Speculative decoding inside the continuous-batching scheduler (issue 12: `serve --spec`), EXACT mode, memcmp:
 *   - many streams in one scheduler, speculating (ngram, self) and plain side by side, queued beyond the
 *     slots, a small token budget (prompts chunked, drafts cut by the budget), with and without a prefix
 *     cache: every greedy output equals plain one-sequence greedy decoding (tm_greedy), and drafts were
 *     verified and accepted (the test would pass vacuously otherwise);
 *   - every speculating stream, greedy or sampled, emits exactly what a dsv4_spec_stream with the same drafter,
 *     prompt and seed emits on its own (speculative.c's loop: no scheduler, no batching) — ngram, self, V4 MTP
 *     and DSpark (with its confidence cut), the last two fed target features through chunked prompts;
 *   - stop sequences, a hook that depends on the generated tokens, and max_new_tokens below the draft length
 *     give the same tokens and finish reasons as the scheduler without speculation;
 *   - bad speculation options are refused at add (DSV4_QUICK: 16 tokens per stream and half the requests); a drafter that cannot be made (a failing factory, MTP on a
 *     checkpoint without the head) finishes only its own request as ERROR. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/drafter_dspark.h"
#include "engine/drafter_mtp.h"
#include "engine/scheduler.h"
#include "helpers/testmodel.h"
#include "model/model.h"
#include "state/prefix_companion.h"
#include "state/prefix_disk.h"
#include "util/error.h"
#include <unistd.h>
#include <xxhash.h>

#define MAX_NEW 40   /* buffer sizes; gen_len tokens are generated */
#define N_REQ 12

/* DSV4_QUICK (the sanitizer run): shorter outputs, half the requests */
static int gen_len = MAX_NEW, n_req = N_REQ;

typedef struct {
    dsv4_model *m, *mtp, *dspark;
    char dir[256], dir_mtp[256], dir_dspark[256];
    int vocab;
} fixture;

static dsv4_model *make_with_head(const char *head, uint64_t seed, char *dir) {
    char tmpl[] = "/tmp/dsv4-test-XXXXXX";
    if (!mkdtemp(tmpl)) return NULL;
    strcpy(dir, tmpl);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "%s tiny -o %s --mtp %s --seed %llu --set compress_ratios=[0,0,4,128,4,128] "
             "--set sliding_window=8 --set index_topk=3 >/dev/null", getenv("DSV4_BIN") ? getenv("DSV4_BIN") : "build/dsv4",
             dir, head, (unsigned long long)seed);
    if (system(cmd)) { fprintf(stderr, "%s failed\n", cmd); return NULL; }
    return tm_load(dir, DSV4_MODE_EXACT, DSV4_DEVICE_CPU, DSV4_KV_F32);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    const char *sets[] = {"compress_ratios=[0,0,4,128,4,128]", "sliding_window=8", "index_topk=3"};
    f->m = tm_make("flash-tiny", sets, 3, 77, DSV4_MODE_EXACT, f->dir);
    f->mtp = make_with_head("v4", 3, f->dir_mtp);
    f->dspark = make_with_head("dspark", 6, f->dir_dspark);
    if (!f->m || !f->mtp || !f->dspark) return -1;
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    dsv4_model_free(f->m);
    dsv4_model_free(f->mtp);
    dsv4_model_free(f->dspark);
    tm_rmdir(f->dir);
    tm_rmdir(f->dir_mtp);
    tm_rmdir(f->dir_dspark);
    free(f);
    return 0;
}

/* ---- drafters by name: the scheduler's factory and the reference loop make the same ones -------------- */

/* "count": drafts last + 1, last + 2, ... — what the force_next hook below makes the target emit, so that its
 * drafts are accepted only when the hook sees each row with the right drafts before it. */
static int count_propose(void *ctx, const int32_t *history, int64_t n_hist, int32_t last, int max_k, int32_t *draft,
                         float *draft_probs, int *probs_given, float *confidence, int *conf_given, dsv4_error *err) {
    const int vocab = *(const int *)ctx;
    *probs_given = 0;
    for (int i = 0; i < max_k; i++) draft[i] = (last + 1 + i) % vocab;
    return max_k;
}

static int make_drafter(void *ctx, dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err) {
    const char *kind = ctx;
    if (!strcmp(kind, "count")) {
        dsv4_model_info info;
        dsv4_model_get_info(m, &info);
        int *vocab = malloc(sizeof *vocab);
        if (!vocab) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
        *vocab = info.vocab_size;
        *out = (dsv4_drafter){ .name = "count", .ctx = vocab, .propose = count_propose, .free = free };
        return 0;
    }
    if (!strcmp(kind, "ngram")) return dsv4_drafter_ngram(1, 4, out, err);
    if (!strcmp(kind, "self")) return dsv4_drafter_self(m, sp, out, err);
    if (!strcmp(kind, "mtp")) return dsv4_drafter_mtp(m, sp, out, err);
    if (!strcmp(kind, "dspark")) return dsv4_drafter_dspark(m, sp, out, err);
    return dsv4_fail(err, DSV4_E_ARG, "no drafter '%s'", kind);
}

/* Prompts with repeats (so prompt lookup finds something); lengths 1 .. 37. */
static int make_prompt(int32_t *p, int vocab, int i) {
    const int n = 1 + (i * 7) % 37;
    tm_tokens(p, n, vocab, 1000 + (uint64_t)i);
    for (int k = n / 2; k < n; k++) p[k] = p[k - n / 2];
    return n;
}

/* The reference: a dsv4_spec_stream alone (speculative.c's own loop). */
static int spec_alone(dsv4_model *m, const char *kind, const int32_t *prompt, int n, dsv4_sampling sp, int draft, float thr,
                      int max_new, int32_t *out) {
    dsv4_error err;
    dsv4_drafter d;
    if (make_drafter((void *)kind, m, &sp, &d, &err)) fail_msg("drafter: %s", err.msg);
    dsv4_spec_opts o = { .draft = draft, .max_new_tokens = max_new, .conf_threshold = thr };
    dsv4_spec_stream *s;
    if (dsv4_spec_stream_new(m, prompt, n, &sp, &o, &d, &s, &err)) fail_msg("spec stream: %s", err.msg);
    while (!dsv4_spec_stream_done(s))
        if (dsv4_spec_step(m, &s, 1, &err)) fail_msg("spec step: %s", err.msg);
    int no;
    const int32_t *o2 = dsv4_spec_stream_output(s, &no);
    memcpy(out, o2, sizeof(int32_t) * (size_t)no);
    dsv4_spec_stream_free(s);
    return no;
}

typedef struct {
    int32_t prompt[128];
    int n_prompt;
    dsv4_request r;
    int64_t id;
    int32_t out[MAX_NEW + 8];
    int n_out;
    dsv4_req_result res;
} job;

/* Run the jobs through one scheduler; results (tokens copied) into the jobs. */
static void run_jobs(dsv4_model *m, job *jobs, int n, int max_streams, int step_tokens, dsv4_prefix_cache *pc) {
    dsv4_sched *s;
    dsv4_error err;
    dsv4_sched_opts o = { max_streams, step_tokens };
    assert_int_equal(dsv4_sched_new(m, &o, &s, &err), 0);
    if (pc) dsv4_sched_set_prefix_cache(s, pc);
    for (int i = 0; i < n; i++) {
        jobs[i].r.prompt = jobs[i].prompt;
        jobs[i].r.n_prompt = jobs[i].n_prompt;
        if (dsv4_sched_add(s, &jobs[i].r, &jobs[i].id, &err)) fail_msg("add %d: %s", i, err.msg);
    }
    while (dsv4_sched_pending(s))
        if (dsv4_sched_step(s, &err)) fail_msg("step: %s", err.msg);
    for (int i = 0; i < n; i++) {
        assert_int_equal(dsv4_sched_result(s, jobs[i].id, &jobs[i].res, &err), 0);
        jobs[i].n_out = jobs[i].res.n_tokens;
        memcpy(jobs[i].out, jobs[i].res.tokens, sizeof(int32_t) * (size_t)jobs[i].n_out);
        jobs[i].res.tokens = NULL;
    }
    dsv4_sched_free(s);
}

static dsv4_sampling greedy(void) { return (dsv4_sampling){ 0.0f, 0, 1.0f, 0.0f, 1 }; }
static dsv4_sampling sampled(uint64_t seed) { return (dsv4_sampling){ 0.9f, 0, 0.95f, 0.0f, seed }; }

/* ---- tests --------------------------------------------------------------------------------------------------- */

static void greedy_mixed_streams(void **state) {
    fixture *f = *state;
    static const char *kinds[] = { "ngram", NULL, "self", "ngram", NULL, "ngram" };
    static job jobs[N_REQ];
    for (int pass = 0; pass < 2; pass++) {
        dsv4_prefix_cache *pc = NULL;
        if (pass == 1) assert_int_equal(dsv4_prefix_cache_new(64 << 20, &pc, NULL), 0);
        memset(jobs, 0, sizeof jobs);
        for (int i = 0; i < n_req; i++) {
            /* pass 1 repeats prompts (i and i + n_req / 2 share one) so the cache has something to give */
            jobs[i].n_prompt = make_prompt(jobs[i].prompt, f->vocab, pass ? i % (n_req / 2) : i);
            jobs[i].r.sampling = greedy();
            jobs[i].r.max_new_tokens = gen_len;
            const char *k = kinds[i % 6];
            if (k) jobs[i].r.spec = (dsv4_sched_spec){ make_drafter, (void *)k, 1 + i % 5, 0.0f };
        }
        run_jobs(f->m, jobs, n_req, 5, 16, pc);
        int64_t drafted = 0, accepted = 0, cached = 0;
        for (int i = 0; i < n_req; i++) {
            int32_t want[MAX_NEW];
            assert_int_equal(tm_greedy(f->m, jobs[i].prompt, jobs[i].n_prompt, gen_len, want), 0);
            if (jobs[i].n_out != gen_len || memcmp(jobs[i].out, want, sizeof(int32_t) * (size_t)gen_len))
                fail_msg("pass %d, request %d (%s, draft %d): %d tokens, differs from plain greedy", pass, i,
                         kinds[i % 6] ? kinds[i % 6] : "plain", jobs[i].r.spec.draft, jobs[i].n_out);
            assert_int_equal(jobs[i].res.finish, DSV4_FINISH_LENGTH);
            assert_int_equal(jobs[i].res.n_prompt_done, jobs[i].n_prompt);
            if (!kinds[i % 6]) assert_int_equal(jobs[i].res.spec_drafted, 0);
            else assert_true(jobs[i].res.spec_steps > 0 && jobs[i].res.spec_steps <= gen_len);
            drafted += jobs[i].res.spec_drafted;
            accepted += jobs[i].res.spec_accepted;
            if (kinds[i % 6] && !strcmp(kinds[i % 6], "ngram")) cached += jobs[i].res.n_cached;
        }
        /* speculation happened: drafts were verified, some accepted (self-drafting accepts all of its own) */
        assert_true(drafted > 0);
        assert_true(accepted > 0 && accepted <= drafted);
        if (pass == 1) assert_true(cached > 0);
        dsv4_prefix_cache_free(pc);
    }
}

/* Each speculating stream of a mixed batch emits what the same stream alone in speculative.c's loop emits. */
static void equals_spec_stream(dsv4_model *m, const char *kind, float thr, int draft, int step_tokens, int use_cache) {
    enum { N = 6 };
    static job jobs[N];
    memset(jobs, 0, sizeof jobs);
    dsv4_prefix_cache *pc = NULL;
    if (use_cache) assert_int_equal(dsv4_prefix_cache_new(64 << 20, &pc, NULL), 0);
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    for (int i = 0; i < N; i++) {
        jobs[i].n_prompt = make_prompt(jobs[i].prompt, info.vocab_size, 3 * i + 1);
        jobs[i].r.sampling = i % 3 == 0 ? greedy() : sampled(50 + (uint64_t)i);
        jobs[i].r.max_new_tokens = gen_len - i;
        if (i != 4) jobs[i].r.spec = (dsv4_sched_spec){ make_drafter, (void *)kind, draft, thr }; /* 4: a plain neighbour */
    }
    run_jobs(m, jobs, N, 4, step_tokens, pc);
    int64_t drafted = 0;
    for (int i = 0; i < N; i++) {
        if (i == 4) continue;
        int32_t want[MAX_NEW];
        const int nw = spec_alone(m, kind, jobs[i].prompt, jobs[i].n_prompt, jobs[i].r.sampling, draft, thr, gen_len - i, want);
        if (jobs[i].n_out != nw || memcmp(jobs[i].out, want, sizeof(int32_t) * (size_t)nw))
            fail_msg("%s, request %d (%s): the scheduler's stream differs from dsv4_spec_stream (%d vs %d tokens)", kind, i,
                     i % 3 == 0 ? "greedy" : "sampled", jobs[i].n_out, nw);
        drafted += jobs[i].res.spec_drafted;
        if (i % 3 == 0) {
            assert_int_equal(tm_greedy(m, jobs[i].prompt, jobs[i].n_prompt, gen_len - i, want), 0);
            assert_memory_equal(jobs[i].out, want, sizeof(int32_t) * (size_t)(gen_len - i));
        }
    }
    assert_true(drafted > 0);
    dsv4_prefix_cache_free(pc);
}

static void ngram_and_self_equal_spec_stream(void **state) {
    fixture *f = *state;
    equals_spec_stream(f->m, "ngram", 0.0f, 4, 0, 0);
    if (n_req == N_REQ) equals_spec_stream(f->m, "ngram", 0.0f, 3, 9, 1);   /* not in the quick run */
    equals_spec_stream(f->m, "self", 0.0f, 2, 12, 0);
}

static void mtp_and_dspark_equal_spec_stream(void **state) {
    fixture *f = *state;
    /* a budget of 10 tokens chunks the prompts: the drafters get their target features chunk by chunk; with a
     * cache they must not fork from it (they need every row) */
    equals_spec_stream(f->mtp, "mtp", 0.0f, 1, 10, 1);
    equals_spec_stream(f->dspark, "dspark", 0.0f, 4, 10, 1);
    if (n_req == N_REQ) equals_spec_stream(f->dspark, "dspark", 0.5f, 4, 0, 0);
}

/* Prefix reuse by drafters fed from target features (MTP, DSpark): a speculating stream that forks a cached state
 * gets the drafter's state stored beside it, and emits exactly what the same stream emits after prefilling its
 * whole prompt without a cache — tokens, finish, drafts verified and accepted (memcmp), greedy and sampled. The
 * second round's prompts hit the cache three ways: the same prompt (the drafter resumes at the anchor), the next
 * turn of a conversation (prompt + output + more: the final state of the first round), and the prompt with another
 * token at the stored position (MTP's row there depends on that token). The second round runs twice: on the cache
 * that ran the first (memory hits), and after a restart — a new cache, empty memory, over a copy of the folder the
 * first round filled — where the states and the drafter states come from the disk tier's files. */
/* The drafts of a step are capped by the step's budget, which the neighbours' prompt chunks share (fewer with a
 * cache): a round either has no budget or one stream at a time, so that the drafts compare too. ref: the same
 * jobs run without a cache (computed here when fill_ref). */
static void reuse_round(dsv4_model *m, const char *kind, int draft, job *jobs, int n, int streams, int step_tokens,
                        dsv4_prefix_cache *pc, job *ref, int fill_ref) {
    if (fill_ref) {
        memcpy(ref, jobs, sizeof(job) * (size_t)n);
        run_jobs(m, ref, n, streams, step_tokens, NULL);
    }
    run_jobs(m, jobs, n, streams, step_tokens, pc);
    for (int i = 0; i < n; i++) {
        if (jobs[i].n_out != ref[i].n_out || memcmp(jobs[i].out, ref[i].out, sizeof(int32_t) * (size_t)ref[i].n_out))
            fail_msg("%s draft %d, request %d (%s, %lld cached): tokens differ from a full prefill (%d vs %d)", kind, draft, i,
                     jobs[i].r.sampling.temperature > 0 ? "sampled" : "greedy", (long long)jobs[i].res.n_cached, jobs[i].n_out, ref[i].n_out);
        assert_int_equal(jobs[i].res.finish, ref[i].res.finish);
        if (jobs[i].res.spec_drafted != ref[i].res.spec_drafted || jobs[i].res.spec_accepted != ref[i].res.spec_accepted ||
            jobs[i].res.spec_steps != ref[i].res.spec_steps)
            fail_msg("%s draft %d, request %d: %lld/%lld drafts accepted in %lld steps, a full prefill %lld/%lld in %lld", kind,
                     draft, i, (long long)jobs[i].res.spec_accepted, (long long)jobs[i].res.spec_drafted, (long long)jobs[i].res.spec_steps,
                     (long long)ref[i].res.spec_accepted, (long long)ref[i].res.spec_drafted, (long long)ref[i].res.spec_steps);
        assert_int_equal(ref[i].res.n_cached, 0);
    }
}

/* Files in dir whose names end with suffix. */
static int count_files(const char *dir, const char *suffix) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c -- '%s$'", dir, suffix);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (!p || fscanf(p, "%d", &n) != 1) n = -1;
    if (p) pclose(p);
    return n;
}

static void expect_cached(const char *kind, const char *how, const job *first, const job *second, int n) {
    for (int i = 0; i < n; i++) {
        const int n_a = first[i].n_prompt;
        /* every request forked where the first round stored a state with the drafter's */
        if (second[3 * i].res.n_cached != n_a - 1 || second[3 * i + 1].res.n_cached != n_a + first[i].n_out - 1 ||
            second[3 * i + 2].res.n_cached != n_a - 1)
            fail_msg("%s (%s), request %d: cached %lld / %lld / %lld tokens, expected %d / %d / %d", kind, how, i,
                     (long long)second[3 * i].res.n_cached, (long long)second[3 * i + 1].res.n_cached,
                     (long long)second[3 * i + 2].res.n_cached, n_a - 1, n_a + first[i].n_out - 1, n_a - 1);
    }
}

static void prefix_reuse(dsv4_model *m, const char *kind, int draft) {
    enum { N = 3 };
    static job first[N], second[3 * N], again[3 * N], ref1[N], ref2[3 * N];
    memset(first, 0, sizeof first);
    memset(second, 0, sizeof second);
    dsv4_model_info info;
    dsv4_model_get_info(m, &info);
    char dir[] = "/tmp/dsv4-prefix-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char disk[64], restart[64], cmd[256];
    snprintf(disk, sizeof disk, "%s/a", dir);
    snprintf(restart, sizeof restart, "%s/b", dir);
    dsv4_prefix_cache *pc;
    assert_int_equal(dsv4_prefix_cache_new(64 << 20, &pc, NULL), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(pc, disk, 64 << 20, NULL), 0);
    const dsv4_sched_spec spec = { make_drafter, (void *)kind, draft, 0.0f };
    for (int i = 0; i < N; i++) {
        /* prompts of 11 .. 31 tokens: beyond the window of 8, so the drafter's rings have wrapped */
        first[i].n_prompt = 11 + 10 * i;
        tm_tokens(first[i].prompt, first[i].n_prompt, info.vocab_size, 500 + (uint64_t)i);
        first[i].r.sampling = i % 2 ? sampled(90 + (uint64_t)i) : greedy();
        first[i].r.max_new_tokens = gen_len / 3 + 2;
        first[i].r.spec = spec;
    }
    /* fills the cache (and matches a full prefill with a cache present): three streams at once */
    reuse_round(m, kind, draft, first, N, 3, 0, pc, ref1, 1);
    /* what the disk tier holds now: a state at the end of each prompt and at the end of each stream, each with the
     * drafter's state; kept aside for the restart (the memory round below adds its own entries to the folder) */
    char suffix[32];
    snprintf(suffix, sizeof suffix, ".%s.dsv4comp", kind);
    if (count_files(disk, ".dsv4seq") != 2 * N || count_files(disk, suffix) != 2 * N)
        fail_msg("%s: the first round left %d states and %d drafter states on disk, expected %d of each", kind,
                 count_files(disk, ".dsv4seq"), count_files(disk, suffix), 2 * N);
    snprintf(cmd, sizeof cmd, "cp -r %s %s", disk, restart);
    assert_int_equal(system(cmd), 0);
    for (int i = 0; i < N; i++) {
        const job *a = &first[i];
        job *same = &second[3 * i], *next = &second[3 * i + 1], *other = &second[3 * i + 2];
        *same = *a;
        /* the next turn: prompt, output, three more tokens */
        *next = *a;
        memcpy(next->prompt + a->n_prompt, a->out, sizeof(int32_t) * (size_t)a->n_out);
        next->n_prompt = a->n_prompt + a->n_out + 3;
        tm_tokens(next->prompt + a->n_prompt + a->n_out, 3, info.vocab_size, 700 + (uint64_t)i);
        /* another token where the first round's anchor was, then five more */
        *other = *a;
        other->prompt[a->n_prompt - 1] = (a->prompt[a->n_prompt - 1] + 1) % info.vocab_size;
        tm_tokens(other->prompt + a->n_prompt, 5, info.vocab_size, 800 + (uint64_t)i);
        other->n_prompt = a->n_prompt + 5;
        for (int k = 0; k < 3; k++) {
            job *j = &second[3 * i + k];
            j->r.sampling = (i + k) % 2 ? sampled(30 + (uint64_t)(3 * i + k)) : greedy();
            j->r.max_new_tokens = gen_len / 3 + 2;
            j->n_out = 0;
            memset(&j->res, 0, sizeof j->res);
        }
    }
    memcpy(again, second, sizeof again);
    /* one stream at a time, prompts (what is left after the fork) in chunks of 10 tokens */
    reuse_round(m, kind, draft, second, 3 * N, 1, 10, pc, ref2, 1);
    expect_cached(kind, "memory", first, second, N);
    int64_t drafted = 0;
    for (int i = 0; i < 3 * N; i++) drafted += second[i].res.spec_drafted;
    assert_true(drafted > 0);
    dsv4_prefix_cache_stats st;
    dsv4_prefix_cache_get_stats(pc, &st);
    assert_int_equal(st.disk_hits, 0);   /* memory served every hit */
    dsv4_prefix_cache_free(pc);
    /* the restart: the same requests, and the same tokens, drafts and acceptance as a full prefill */
    assert_int_equal(dsv4_prefix_cache_new(64 << 20, &pc, NULL), 0);
    assert_int_equal(dsv4_prefix_cache_set_dir(pc, restart, 64 << 20, NULL), 0);
    reuse_round(m, kind, draft, again, 3 * N, 1, 10, pc, ref2, 0);
    expect_cached(kind, "disk, after a restart", first, again, N);
    dsv4_prefix_cache_get_stats(pc, &st);
    /* "same" comes from disk, and "other" forks the entry "same" brought into memory; "next" comes from disk
     * unless "same" reproduced the first round's output (then its final state, the one "next" wants, is in
     * memory already) */
    int64_t want_disk = N;
    for (int i = 0; i < N; i++)
        want_disk += again[3 * i].n_out != first[i].n_out || memcmp(again[3 * i].out, first[i].out, sizeof(int32_t) * (size_t)first[i].n_out);
    if (st.disk_hits != want_disk || st.hits != 3 * N || st.disk_rejected != 0)
        fail_msg("%s: %lld hits, %lld of them from disk, %lld rejected files after the restart, expected %d, %lld, 0", kind,
                 (long long)st.hits, (long long)st.disk_hits, (long long)st.disk_rejected, 3 * N, (long long)want_disk);
    dsv4_prefix_cache_free(pc);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void mtp_and_dspark_reuse_prefixes(void **state) {
    fixture *f = *state;
    prefix_reuse(f->mtp, "mtp", 1);
    prefix_reuse(f->dspark, "dspark", 4);
}

/* Drafter states on disk (state/prefix_companion.h), damaged and foreign. One stream of each kind fills a cache
 * folder; its drafter state at the end of the prompt then (a) decodes and re-encodes to the same payload (round
 * trip), (b) is refused with a one-line message naming the damage when read directly, and (c) is a clean miss for
 * a speculating lookup — the companion file removed and counted as rejected, the state file kept and still served
 * to a plain lookup — for each entry of a table of damages; (d) a stream over the damaged folder gives the cold
 * run's tokens. Codecs refuse another drafter's model. */
typedef struct {
    const char *name, *message;   /* the damage, a piece of the error message */
    void (*apply)(uint8_t *b, size_t *len, const uint8_t *other, size_t other_len);
    int fix_sum;                  /* recompute the trailing checksum afterwards */
} damage;

static void d_byte(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { b[*len - 20] ^= 0x40; }
static void d_short(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { *len -= 1; }
static void d_long(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { b[(*len)++] = 0; }
static void d_empty(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { *len = 0; }
static void d_magic(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { b[3] = 'X'; }
static void d_version(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { b[8] = 2; }
static void d_kind(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { memset(b + 12, 0, 16); memcpy(b + 12, "self", 4); }
static void d_model(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { b[28] ^= 1; }
static void d_mode(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { b[36] ^= 1; }
static void d_pos(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { b[44] -= 1; }
static void d_tokens(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { b[52] ^= 1; }
static void d_shape(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { b[PREFIX_COMPANION_HEADER + 4] ^= 1; } /* window */
static void d_other(uint8_t *b, size_t *len, const uint8_t *o, size_t ol) { memcpy(b, o, ol); *len = ol; }

static const damage damages[] = {
    { "a flipped byte", "checksum mismatch", d_byte, 0 },
    { "one byte short", "implies", d_short, 0 },
    { "one byte more", "implies", d_long, 0 },
    { "empty", "truncated", d_empty, 0 },
    { "bad magic", "bad magic", d_magic, 0 },
    { "version 2", "version 2 is not supported", d_version, 1 },
    { "another kind", "holds a \"self\" drafter state", d_kind, 1 },
    { "another model", "another model", d_model, 1 },
    { "another numeric mode", "another model", d_mode, 1 },
    { "another position", "another prefix", d_pos, 1 },
    { "other tokens", "another prefix", d_tokens, 1 },
    { "another window in the payload", "window", d_shape, 1 },
    { "the other drafter's file", "drafter state", d_other, 0 },
};

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *b = malloc(1 << 20);
    *len = b ? fread(b, 1, (1 << 20) - 64, f) : 0;
    fclose(f);
    return b;
}

static void write_all(const char *path, const uint8_t *b, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

static void damaged_drafter_states(void **state) {
    fixture *f = *state;
    dsv4_model *models[2] = { f->mtp, f->dspark };
    const char *kinds[2] = { "mtp", "dspark" };
    char dir[] = "/tmp/dsv4-prefix-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char disk[2][64], comp_path[2][4300], state_path[2][4300];
    static job cold[2], warm;
    uint8_t *file[2];
    size_t file_len[2];
    dsv4_drafter dr[2];
    const dsv4_sampling g = greedy();
    for (int k = 0; k < 2; k++) {
        dsv4_model *m = models[k];
        snprintf(disk[k], sizeof disk[k], "%s/%s", dir, kinds[k]);
        memset(&cold[k], 0, sizeof cold[k]);
        cold[k].n_prompt = 15;
        tm_tokens(cold[k].prompt, 15, f->vocab, 900 + (uint64_t)k);
        cold[k].r.sampling = greedy();
        cold[k].r.max_new_tokens = 6;
        cold[k].r.spec = (dsv4_sched_spec){ make_drafter, (void *)kinds[k], k ? 4 : 1, 0.0f };
        dsv4_prefix_cache *pc;
        assert_int_equal(dsv4_prefix_cache_new(64 << 20, &pc, NULL), 0);
        assert_int_equal(dsv4_prefix_cache_set_dir(pc, disk[k], 64 << 20, NULL), 0);
        run_jobs(m, &cold[k], 1, 1, 0, pc);
        dsv4_prefix_cache_free(pc);
        prefix_disk_companion_path(comp_path[k], sizeof comp_path[k], disk[k], m->fingerprint, cold[k].prompt, 14, kinds[k]);
        prefix_disk_state_path(state_path[k], sizeof state_path[k], disk[k], m->fingerprint, cold[k].prompt, 14);
        assert_true(file_exists(state_path[k]));
        file[k] = read_all(comp_path[k], &file_len[k]);
        assert_non_null(file[k]);
        assert_int_equal(make_drafter((void *)kinds[k], m, &g, &dr[k], NULL), 0);
        assert_non_null(dr[k].prefix_codec);
        /* (a) round trip: the payload decodes, and encodes to the same bytes */
        dsv4_error err;
        prefix_companion *pcomp;
        if (prefix_companion_file_load(comp_path[k], dr[k].prefix_codec, m, cold[k].prompt, 14, &pcomp, &err))
            fail_msg("%s: %s", kinds[k], err.msg);
        void *payload;
        size_t plen;
        assert_int_equal(dr[k].prefix_codec->encode(pcomp, &payload, &plen, &err), 0);
        assert_int_equal(plen, file_len[k] - PREFIX_COMPANION_HEADER - 8);
        assert_memory_equal(payload, file[k] + PREFIX_COMPANION_HEADER, plen);
        /* a codec refuses the other drafter's model (it has no such head) */
        prefix_companion *no;
        assert_int_not_equal(dr[k].prefix_codec->decode(models[1 - k], cold[k].prompt, 14, payload, plen, &no, &err), 0);
        assert_non_null(strstr(err.msg, "this checkpoint has no"));
        free(payload);
        pcomp->free(pcomp);
    }
    for (int k = 0; k < 2; k++) {
        dsv4_model *m = models[k];
        for (size_t d = 0; d < sizeof damages / sizeof *damages; d++) {
            const damage *dm = &damages[d];
            uint8_t *b = malloc(file_len[0] + file_len[1] + 64);
            size_t len = file_len[k];
            memcpy(b, file[k], len);
            dm->apply(b, &len, file[1 - k], file_len[1 - k]);
            if (dm->fix_sum) {
                const uint64_t h = XXH64(b, len - 8, 0);
                memcpy(b + len - 8, &h, 8);
            }
            write_all(comp_path[k], b, len);
            free(b);
            /* (b) a one-line error that names the damage */
            dsv4_error err = {0};
            prefix_companion *pcomp = NULL;
            if (!prefix_companion_file_load(comp_path[k], dr[k].prefix_codec, m, cold[k].prompt, 14, &pcomp, &err))
                fail_msg("%s, %s: loaded", kinds[k], dm->name);
            if (!strstr(err.msg, dm->message) || strchr(err.msg, '\n'))
                fail_msg("%s, %s: the message is \"%s\", expected it to mention \"%s\"", kinds[k], dm->name, err.msg, dm->message);
            /* (c) a clean miss for the speculating lookup; the state stays for everyone else */
            dsv4_prefix_cache *pc;
            assert_int_equal(dsv4_prefix_cache_new(64 << 20, &pc, NULL), 0);
            assert_int_equal(dsv4_prefix_cache_set_dir(pc, disk[k], 64 << 20, NULL), 0);
            dsv4_seq *seq;
            int64_t matched = -1;
            const prefix_companion *got;
            assert_int_equal(prefix_cache_lookup_with(pc, m, cold[k].prompt, 14, kinds[k], dr[k].prefix_codec, &seq, &matched,
                                                      &got, &err), 0);
            dsv4_prefix_cache_stats st;
            dsv4_prefix_cache_get_stats(pc, &st);
            if (matched != 0 || got || st.disk_rejected != 1 || file_exists(comp_path[k]) || !file_exists(state_path[k]))
                fail_msg("%s, %s: matched %lld, companion %s, %lld rejected, companion file %s, state file %s", kinds[k], dm->name,
                         (long long)matched, got ? "given" : "none", (long long)st.disk_rejected,
                         file_exists(comp_path[k]) ? "kept" : "removed", file_exists(state_path[k]) ? "kept" : "removed");
            dsv4_seq_free(seq);
            assert_int_equal(dsv4_prefix_cache_lookup(pc, m, cold[k].prompt, 14, &seq, &matched, &err), 0);
            assert_int_equal(matched, 14);
            dsv4_seq_free(seq);
            dsv4_prefix_cache_free(pc);
        }
        /* (d) a stream over the damaged folder (its companion was removed last) prefills and gives the cold tokens */
        file[k][file_len[k] - 30] ^= 1;
        write_all(comp_path[k], file[k], file_len[k]);
        file[k][file_len[k] - 30] ^= 1;
        warm = cold[k];
        warm.n_out = 0;
        memset(&warm.res, 0, sizeof warm.res);
        dsv4_prefix_cache *pc;
        assert_int_equal(dsv4_prefix_cache_new(64 << 20, &pc, NULL), 0);
        assert_int_equal(dsv4_prefix_cache_set_dir(pc, disk[k], 64 << 20, NULL), 0);
        run_jobs(m, &warm, 1, 1, 0, pc);
        dsv4_prefix_cache_free(pc);
        assert_int_equal(warm.res.n_cached, 0);
        assert_int_equal(warm.n_out, cold[k].n_out);
        assert_memory_equal(warm.out, cold[k].out, sizeof(int32_t) * (size_t)warm.n_out);
        assert_int_equal(warm.res.spec_accepted, cold[k].res.spec_accepted);
        /* ... and stored a good one again */
        assert_true(file_exists(comp_path[k]));
    }
    for (int k = 0; k < 2; k++) {
        free(file[k]);
        dsv4_drafter_free(&dr[k]);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A hook that forbids repeating the previous generated token: it depends on the generated tokens, so a
 * speculating stream must give it each row with the drafts before it. */
static int no_repeat(void *ctx, const int32_t *gen, int n_gen, float *logits, int vocab) {
    (void)ctx;
    if (n_gen > 0 && gen[n_gen - 1] >= 0 && gen[n_gen - 1] < vocab) logits[gen[n_gen - 1]] = -INFINITY;
    return 0;
}

/* A hook that makes the next token the last generated one + 1 (the first is the model's). */
static int force_next(void *ctx, const int32_t *gen, int n_gen, float *logits, int vocab) {
    (void)ctx;
    if (n_gen > 0) logits[(gen[n_gen - 1] + 1) % vocab] += 1000.0f;
    return 0;
}

static void stops_hooks_and_short_budgets(void **state) {
    fixture *f = *state;
    enum { N = 10 };
    static job plain[N], spec[N];
    int32_t ref[MAX_NEW];
    int32_t p0[64];
    const int n0 = make_prompt(p0, f->vocab, 5);
    assert_int_equal(tm_greedy(f->m, p0, n0, gen_len, ref), 0);
    /* stop sequences taken from the plain output: one token, two tokens, one that never occurs */
    static int32_t stop1[1], stop2[2], never[3];
    stop1[0] = ref[9];
    memcpy(stop2, ref + 5, sizeof stop2);
    never[0] = never[1] = never[2] = 0;
    const dsv4_stop_seq stops[] = { { stop1, 1 }, { stop2, 2 }, { never, 3 } };
    for (int v = 0; v < 2; v++) {
        job *jobs = v ? spec : plain;
        memset(jobs, 0, sizeof(job) * N);
        for (int i = 0; i < N; i++) {
            jobs[i].n_prompt = make_prompt(jobs[i].prompt, f->vocab, i < 3 ? 5 : i);
            jobs[i].r.sampling = greedy();
            jobs[i].r.max_new_tokens = gen_len;
            if (i < 3) { jobs[i].r.stop = &stops[i]; jobs[i].r.n_stop = 1; }
            if (i == 3) jobs[i].r.hook = (dsv4_logits_hook){ no_repeat, NULL };
            if (i == 4) jobs[i].r.hook = (dsv4_logits_hook){ force_next, NULL };
            if (i >= 5 && i <= 7) jobs[i].r.max_new_tokens = i - 4; /* 1..3 tokens, draft 4 */
            if (i == 8) { jobs[i].r.stop_on_eos = 1; jobs[i].r.sampling = sampled(9); }
            if (v) jobs[i].r.spec = (dsv4_sched_spec){ make_drafter, (void *)(i == 4 ? "count" : "ngram"), 4, 0.0f };
        }
        run_jobs(f->m, jobs, N, 3, 0, NULL);
    }
    for (int i = 0; i < N; i++) {
        if (i == 8) continue; /* sampled: speculation draws differently; checked for a clean finish below */
        if (spec[i].n_out != plain[i].n_out || memcmp(spec[i].out, plain[i].out, sizeof(int32_t) * (size_t)plain[i].n_out) ||
            spec[i].res.finish != plain[i].res.finish)
            fail_msg("request %d: speculation gives %d tokens (%s), plain %d (%s)", i, spec[i].n_out,
                     dsv4_finish_name(spec[i].res.finish), plain[i].n_out, dsv4_finish_name(plain[i].res.finish));
    }
    assert_int_equal(plain[0].res.finish, DSV4_FINISH_STOP);
    assert_true(plain[0].n_out <= 10);
    assert_int_equal(plain[1].res.finish, DSV4_FINISH_STOP);
    assert_int_equal(plain[2].res.finish, DSV4_FINISH_LENGTH);
    for (int k = 1; k < plain[3].n_out; k++) assert_int_not_equal(plain[3].out[k], plain[3].out[k - 1]);
    for (int k = 1; k < plain[4].n_out; k++) assert_int_equal(plain[4].out[k], (plain[4].out[k - 1] + 1) % f->vocab);
    /* the count drafter is right from the first token on: (gen_len - 1) / 5 steps of 4 accepted drafts + a bonus */
    assert_true(spec[4].res.spec_accepted >= gen_len - 10);
    assert_int_equal(spec[5].n_out, 1);
    assert_int_equal(spec[7].n_out, 3);
    assert_true(spec[8].res.finish == DSV4_FINISH_LENGTH || spec[8].res.finish == DSV4_FINISH_EOS);
}

static int failing_factory(void *ctx, dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err) {
    return dsv4_fail(err, DSV4_E_STATE, "no drafter today");
}

static void refusals(void **state) {
    fixture *f = *state;
    dsv4_sched *s;
    dsv4_error err;
    dsv4_sched_opts o = { 3, 0 };
    assert_int_equal(dsv4_sched_new(f->m, &o, &s, &err), 0);
    int32_t p[8];
    tm_tokens(p, 8, f->vocab, 4);
    dsv4_request r = { .prompt = p, .n_prompt = 8, .sampling = greedy(), .max_new_tokens = 6 };
    int64_t id;
    r.spec = (dsv4_sched_spec){ make_drafter, (void *)"ngram", 0, 0.0f };
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), DSV4_E_ARG);
    assert_non_null(strstr(err.msg, "drafts per step"));
    r.spec.draft = 16; /* the default max_spec is 16 ring slots: at most 15 drafts */
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), DSV4_E_ARG);
    r.spec.draft = 2;
    r.spec.conf_threshold = 1.5f;
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), DSV4_E_ARG);
    /* factories that fail end their own request; the neighbour is untouched */
    int64_t ids[3];
    r.spec = (dsv4_sched_spec){ failing_factory, NULL, 2, 0.0f };
    assert_int_equal(dsv4_sched_add(s, &r, &ids[0], &err), 0);
    r.spec = (dsv4_sched_spec){ make_drafter, (void *)"mtp", 1, 0.0f }; /* flash-tiny has no MTP head */
    assert_int_equal(dsv4_sched_add(s, &r, &ids[1], &err), 0);
    r.spec = (dsv4_sched_spec){ make_drafter, (void *)"ngram", 3, 0.0f };
    assert_int_equal(dsv4_sched_add(s, &r, &ids[2], &err), 0);
    while (dsv4_sched_pending(s)) assert_int_equal(dsv4_sched_step(s, &err), 0);
    dsv4_req_result res;
    int32_t want[6];
    assert_int_equal(tm_greedy(f->m, p, 8, 6, want), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dsv4_sched_result(s, ids[i], &res, &err), 0);
        assert_int_equal(res.finish, i < 2 ? DSV4_FINISH_ERROR : DSV4_FINISH_LENGTH);
        if (i == 2) assert_memory_equal(res.tokens, want, sizeof want);
    }
    assert_int_equal(dsv4_sched_running(s), 0);
    dsv4_sched_free(s);
}

int main(void) {
    if (getenv("DSV4_QUICK")) { gen_len = 16; n_req = 6; }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_mixed_streams),
        cmocka_unit_test(ngram_and_self_equal_spec_stream),
        cmocka_unit_test(mtp_and_dspark_equal_spec_stream),
        cmocka_unit_test(mtp_and_dspark_reuse_prefixes),
        cmocka_unit_test(damaged_drafter_states),
        cmocka_unit_test(stops_hooks_and_short_budgets),
        cmocka_unit_test(refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
