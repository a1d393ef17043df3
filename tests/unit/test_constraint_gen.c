/* Constrained generation on a tiny random-weight model (issue 13), with the tiny test tokenizer:
 *   - batched streams with different schemas, JSON mode and a grammar, sampled at temperature 1: every stream
 *     ends with EOS within its token budget and its text parses (jansson) and validates against its schema with
 *     the independent validator (tests/unit/helpers/mini_validator.c); each stream's tokens equal the same
 *     request run alone (memcmp);
 *   - speculative decoding with constraints (n-gram and self drafters, several streams in one step) gives the
 *     same greedy tokens as plain constrained greedy decoding (memcmp); sampled speculative output validates;
 *   - termination: a random model under an unbounded schema (arrays of strings) always completes within small
 *     budgets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "helpers/mini_validator.h"
#include "helpers/testmodel.h"
#include "engine/constraint.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "text/tokenizer.h"

static const char *const SETS[] = {"compress_ratios=[0,0,4,128]", "sliding_window=8", "index_topk=3"};

static const char *const SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":10},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
    "\"email\":{\"type\":\"string\",\"pattern\":\"^[a-z]+@[a-z]+\\\\.com$\"}},\"required\":[\"name\",\"age\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}",
    "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"child\":{\"anyOf\":[{\"$ref\":\"#/$defs/n\"},{\"type\":\"null\"}]}},"
    "\"required\":[\"id\",\"child\"]}},\"$ref\":\"#/$defs/n\"}",
    "{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"array\",\"prefixItems\":[{\"enum\":[\"x\",\"y\"]},{\"type\":\"number\"}],\"items\":false,\"minItems\":2}]}",
    "true", /* JSON mode */
    NULL};
#define N_SCHEMAS 5
#define GRAMMAR "root ::= (\"yes\" | \"no\") \" \" [0-9]{1,3}\n"

typedef struct {
    dsv4_model *m;
    char dir[256];
    dsv4_cvocab *v;
    dsv4_grammar *g[N_SCHEMAS + 1];   /* the schemas, then the grammar */
    json_t *schema[N_SCHEMAS];
    int vocab, eos;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    f->m = tm_make("flash-tiny", SETS, 3, 11, DSV4_MODE_EXACT, f->dir);
    if (!f->m) return -1;
    dsv4_model_info info;
    dsv4_model_get_info(f->m, &info);
    f->vocab = info.vocab_size;
    f->eos = info.eos_id;
    char path[512];
    const char *root = getenv("DSV4_ROOT");
    snprintf(path, sizeof path, "%s/tests/data/text/tiny_tokenizer.json", root ? root : ".");
    dsv4_tokenizer *t;
    dsv4_error err;
    if (dsv4_tokenizer_load(path, NULL, &t, &err)) { fprintf(stderr, "%s\n", err.msg); return -1; }
    if (dsv4_cvocab_from_tokenizer(t, f->vocab, f->eos, &f->v, &err)) { fprintf(stderr, "%s\n", err.msg); return -1; }
    dsv4_tokenizer_free(t);
    const dsv4_schema_opts o = { 2 };
    for (int i = 0; i < N_SCHEMAS; i++) {
        json_error_t je;
        f->schema[i] = json_loads(SCHEMAS[i], JSON_DECODE_ANY, &je);
        if (!f->schema[i] || dsv4_grammar_from_schema(f->schema[i], &o, &f->g[i], &err)) { fprintf(stderr, "schema %d: %s\n", i, err.msg); return -1; }
    }
    if (dsv4_grammar_from_gbnf(GRAMMAR, strlen(GRAMMAR), &f->g[N_SCHEMAS], &err)) { fprintf(stderr, "%s\n", err.msg); return -1; }
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    for (int i = 0; i <= N_SCHEMAS; i++) dsv4_grammar_free(f->g[i]);
    for (int i = 0; i < N_SCHEMAS; i++) json_decref(f->schema[i]);
    dsv4_cvocab_free(f->v);
    dsv4_model_free(f->m);
    tm_rmdir(f->dir);
    free(f);
    return 0;
}

/* The text of tokens (EOS, the last, excluded). */
static size_t text_of(const fixture *f, const int32_t *tok, int n, char *out, size_t cap) {
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (tok[i] == f->eos) { assert_int_equal(i, n - 1); break; }
        size_t len;
        const char *b = dsv4_cvocab_bytes(f->v, tok[i], &len);
        if (!b) fail_msg("token %d has no text", tok[i]);
        assert_true(at + len < cap);
        memcpy(out + at, b, len);
        at += len;
    }
    out[at] = 0;
    return at;
}

/* Output of grammar `which` (a schema index, or N_SCHEMAS for the grammar) is valid: parsed and validated by
 * independent code. */
static void check_output(const fixture *f, int which, const int32_t *tok, int n, const char *what) {
    if (n < 1 || tok[n - 1] != f->eos) fail_msg("%s: does not end with EOS (%d tokens)", what, n);
    char text[8192];
    const size_t len = text_of(f, tok, n, text, sizeof text);
    if (which == N_SCHEMAS) {
        /* (yes|no) ' ' [0-9]{1,3} */
        const char *p = !strncmp(text, "yes ", 4) ? text + 4 : !strncmp(text, "no ", 3) ? text + 3 : NULL;
        size_t d = 0;
        while (p && p[d] >= '0' && p[d] <= '9') d++;
        if (!p || d < 1 || d > 3 || p[d]) fail_msg("%s: '%s' does not match the grammar", what, text);
        return;
    }
    json_error_t je;
    json_t *val = json_loadb(text, len, JSON_DECODE_ANY, &je);
    if (!val) fail_msg("%s: output does not parse (%s): %s", what, je.text, text);
    char why[200];
    if (!mv_valid(f->schema[which], f->schema[which], val, why, sizeof why)) fail_msg("%s: invalid (%s): %s", what, why, text);
    json_decref(val);
}

static void prompt_of(int32_t *p, int i) {
    for (int k = 0; k < 6; k++) p[k] = 2 + (i * 37 + k * 11) % 250;
}

/* Run requests [0, n) through one scheduler; tokens copied into out[i] (n_out[i] of them). */
static int make_ngram(void *ctx, dsv4_model *m, const dsv4_sampling *sp, dsv4_drafter *out, dsv4_error *err) {
    return dsv4_drafter_ngram(1, 4, out, err);
}

/* spec: NULL, or the speculation every request gets (the scheduler's own, scheduler.h) */
static void run_sched_spec(const fixture *f, const int *which, const uint64_t *seeds, float temp, int max_new, int n,
                           int max_streams, int32_t (*out)[256], int *n_out, const dsv4_sched_spec *spec) {
    dsv4_sched *s;
    dsv4_error err;
    const dsv4_sched_opts so = { max_streams, 0 };
    assert_int_equal(dsv4_sched_new(f->m, &so, &s, &err), 0);
    int64_t id[16];
    int32_t prompt[16][6];
    for (int i = 0; i < n; i++) {
        prompt_of(prompt[i], i);
        dsv4_request r = { prompt[i], 6, { temp, 0, 1.0f, 0.0f, seeds[i] }, max_new, 1, NULL, 0, f->g[which[i]], f->v };
        if (spec) r.spec = *spec;
        if (dsv4_sched_add(s, &r, &id[i], &err)) fail_msg("add: %s", err.msg);
    }
    while (dsv4_sched_pending(s) > 0)
        if (dsv4_sched_step(s, &err)) fail_msg("step: %s", err.msg);
    for (int i = 0; i < n; i++) {
        dsv4_req_result r;
        assert_int_equal(dsv4_sched_result(s, id[i], &r, &err), 0);
        if (r.finish != DSV4_FINISH_EOS) fail_msg("request %d finished as %s", i, dsv4_finish_name(r.finish));
        assert_true(r.n_tokens <= max_new);
        memcpy(out[i], r.tokens, sizeof(int32_t) * (size_t)r.n_tokens);
        n_out[i] = r.n_tokens;
    }
    dsv4_sched_free(s);
}

static void run_sched(const fixture *f, const int *which, const uint64_t *seeds, float temp, int max_new, int n, int max_streams,
                      int32_t (*out)[256], int *n_out) {
    run_sched_spec(f, which, seeds, temp, max_new, n, max_streams, out, n_out, NULL);
}

static void test_batched_streams(void **state) {
    fixture *f = *state;
    enum { N = 12 };
    int which[N];
    uint64_t seeds[N];
    for (int i = 0; i < N; i++) { which[i] = i % (N_SCHEMAS + 1); seeds[i] = 100 + (uint64_t)i; }
    static int32_t out[N][256], alone[1][256];
    int n_out[N], n_alone[1];
    run_sched(f, which, seeds, 1.0f, 120, N, N, out, n_out);
    char what[64];
    for (int i = 0; i < N; i++) {
        snprintf(what, sizeof what, "stream %d (grammar %d)", i, which[i]);
        check_output(f, which[i], out[i], n_out[i], what);
    }
    /* batched == alone: the same request (same prompt, seed) in a scheduler of its own */
    for (int i = 0; i < N; i += 3) {
        dsv4_sched *s;
        dsv4_error err;
        const dsv4_sched_opts so = { 1, 0 };
        assert_int_equal(dsv4_sched_new(f->m, &so, &s, &err), 0);
        int32_t prompt[6];
        prompt_of(prompt, i);
        dsv4_request r = { prompt, 6, { 1.0f, 0, 1.0f, 0.0f, seeds[i] }, 120, 1, NULL, 0, f->g[which[i]], f->v };
        int64_t id;
        assert_int_equal(dsv4_sched_add(s, &r, &id, &err), 0);
        while (dsv4_sched_pending(s) > 0) assert_int_equal(dsv4_sched_step(s, &err), 0);
        dsv4_req_result res;
        assert_int_equal(dsv4_sched_result(s, id, &res, &err), 0);
        n_alone[0] = res.n_tokens;
        memcpy(alone[0], res.tokens, sizeof(int32_t) * (size_t)res.n_tokens);
        dsv4_sched_free(s);
        assert_int_equal(n_alone[0], n_out[i]);
        assert_memory_equal(alone[0], out[i], sizeof(int32_t) * (size_t)n_out[i]);
    }
}

/* Requests sharing one matcher per grammar (what a server does for a repeated schema) give the same tokens as
 * requests with private matchers. */
static void test_shared_matchers(void **state) {
    fixture *f = *state;
    enum { N = 12 };
    int which[N];
    uint64_t seeds[N];
    for (int i = 0; i < N; i++) { which[i] = i % (N_SCHEMAS + 1); seeds[i] = 300 + (uint64_t)i; }
    static int32_t priv[N][256];
    int n_priv[N];
    run_sched(f, which, seeds, 1.0f, 100, N, N, priv, n_priv);
    dsv4_cmatcher *mt[N_SCHEMAS + 1];
    dsv4_error err;
    for (int g = 0; g <= N_SCHEMAS; g++) assert_int_equal(dsv4_cmatcher_new(f->g[g], f->v, &mt[g], &err), 0);
    dsv4_sched *s;
    const dsv4_sched_opts so = { N, 0 };
    assert_int_equal(dsv4_sched_new(f->m, &so, &s, &err), 0);
    int64_t id[N];
    int32_t prompt[N][6];
    for (int i = 0; i < N; i++) {
        prompt_of(prompt[i], i);
        dsv4_request r = { prompt[i], 6, { 1.0f, 0, 1.0f, 0.0f, seeds[i] }, 100, 1, NULL, 0, NULL, NULL, mt[which[i]] };
        assert_int_equal(dsv4_sched_add(s, &r, &id[i], &err), 0);
    }
    while (dsv4_sched_pending(s) > 0) assert_int_equal(dsv4_sched_step(s, &err), 0);
    for (int i = 0; i < N; i++) {
        dsv4_req_result r;
        assert_int_equal(dsv4_sched_result(s, id[i], &r, &err), 0);
        assert_int_equal(r.n_tokens, n_priv[i]);
        assert_memory_equal(r.tokens, priv[i], sizeof(int32_t) * (size_t)n_priv[i]);
    }
    dsv4_sched_free(s);
    for (int g = 0; g <= N_SCHEMAS; g++) dsv4_cmatcher_free(mt[g]);
}

/* Small budgets: a random model must still close its value with EOS (the length bound at work). */
static void test_termination(void **state) {
    fixture *f = *state;
    enum { N = 8 };
    int which[N];
    uint64_t seeds[N];
    static int32_t out[N][256];
    int n_out[N];
    for (int budget = 12; budget <= 40; budget += 14) {
        for (int i = 0; i < N; i++) { which[i] = i % 2 ? 1 : 4; seeds[i] = 7 * (uint64_t)budget + (uint64_t)i; }
        run_sched(f, which, seeds, 1.0f, budget, N, 4, out, n_out);
        for (int i = 0; i < N; i++) check_output(f, which[i], out[i], n_out[i], "budgeted stream");
    }
}

/* Speculative streams (one step for all) against plain constrained decoding of the same requests. */
static void spec_run(const fixture *f, const char *drafter, float temp, const int *which, int n, int max_new, int32_t (*out)[256],
                     int *n_out, int shared) {
    dsv4_spec_stream *ss[8];
    dsv4_error err;
    dsv4_cmatcher *mt[N_SCHEMAS + 1] = {0};
    if (shared)
        for (int g = 0; g <= N_SCHEMAS; g++) assert_int_equal(dsv4_cmatcher_new(f->g[g], f->v, &mt[g], &err), 0);
    for (int i = 0; i < n; i++) {
        int32_t prompt[6];
        prompt_of(prompt, i);
        const dsv4_sampling sp = { temp, 0, 1.0f, 0.0f, 100 + (uint64_t)i };
        dsv4_drafter d;
        if (!strcmp(drafter, "ngram")) assert_int_equal(dsv4_drafter_ngram(1, 4, &d, &err), 0);
        else assert_int_equal(dsv4_drafter_self(f->m, &sp, &d, &err), 0);
        dsv4_spec_opts o = { .draft = 5, .max_new_tokens = max_new, .stop_on_eos = 1, .grammar = f->g[which[i]], .cvocab = f->v };
        if (shared) o = (dsv4_spec_opts){ .draft = 5, .max_new_tokens = max_new, .stop_on_eos = 1, .matcher = mt[which[i]] };
        if (dsv4_spec_stream_new(f->m, prompt, 6, &sp, &o, &d, &ss[i], &err)) fail_msg("spec stream: %s", err.msg);
    }
    for (;;) {
        int live = 0;
        for (int i = 0; i < n; i++) live += !dsv4_spec_stream_done(ss[i]);
        if (!live) break;
        if (dsv4_spec_step(f->m, ss, n, &err)) fail_msg("spec step: %s", err.msg);
    }
    for (int i = 0; i < n; i++) {
        const int32_t *o = dsv4_spec_stream_output(ss[i], &n_out[i]);
        memcpy(out[i], o, sizeof(int32_t) * (size_t)n_out[i]);
        dsv4_spec_stream_free(ss[i]);
    }
    for (int g = 0; g <= N_SCHEMAS; g++) dsv4_cmatcher_free(mt[g]);
}

static void test_speculative(void **state) {
    fixture *f = *state;
    enum { N = N_SCHEMAS + 1 };
    int which[N];
    uint64_t seeds[N];
    for (int i = 0; i < N; i++) { which[i] = i; seeds[i] = 100 + (uint64_t)i; }
    static int32_t plain[N][256], spec[N][256];
    int n_plain[N], n_spec[N];
    run_sched(f, which, seeds, 0.0f, 150, N, N, plain, n_plain);
    const char *const drafters[] = { "ngram", "self", "ngram" };
    for (int d = 0; d < 3; d++) {
        spec_run(f, drafters[d], 0.0f, which, N, 150, spec, n_spec, d == 2 /* shared matchers */);
        for (int i = 0; i < N; i++) {
            if (n_spec[i] != n_plain[i] || memcmp(spec[i], plain[i], sizeof(int32_t) * (size_t)n_plain[i]))
                fail_msg("%s drafter, grammar %d: speculative greedy differs from plain (%d vs %d tokens)", drafters[d], i, n_spec[i], n_plain[i]);
            check_output(f, which[i], spec[i], n_spec[i], "speculative greedy");
        }
    }
    /* sampled speculation: a different draw than plain sampling, but the output is still valid */
    spec_run(f, "ngram", 1.0f, which, N, 100, spec, n_spec, 0);
    for (int i = 0; i < N; i++) check_output(f, which[i], spec[i], n_spec[i], "speculative sampled");
    spec_run(f, "self", 1.0f, which, N, 100, spec, n_spec, 1);
    for (int i = 0; i < N; i++) check_output(f, which[i], spec[i], n_spec[i], "speculative sampled (self)");
}

/* Speculation inside the scheduler (every stream constrained): greedy = plain constrained greedy, sampled =
 * dsv4_spec_stream's constrained speculation (same drafter, seeds, prompts), memcmp. */
static void test_sched_speculative(void **state) {
    fixture *f = *state;
    enum { N = N_SCHEMAS + 1 };
    int which[N];
    uint64_t seeds[N];
    for (int i = 0; i < N; i++) { which[i] = i; seeds[i] = 100 + (uint64_t)i; }
    static int32_t plain[N][256], spec[N][256];
    int n_plain[N], n_spec[N];
    const dsv4_sched_spec ngram = { make_ngram, NULL, 5, 0.0f };
    run_sched(f, which, seeds, 0.0f, 150, N, 3, plain, n_plain);
    run_sched_spec(f, which, seeds, 0.0f, 150, N, 3, spec, n_spec, &ngram);
    for (int i = 0; i < N; i++)
        if (n_spec[i] != n_plain[i] || memcmp(spec[i], plain[i], sizeof(int32_t) * (size_t)n_plain[i]))
            fail_msg("grammar %d: the scheduler's speculative greedy differs from plain (%d vs %d tokens)", i, n_spec[i], n_plain[i]);
    run_sched_spec(f, which, seeds, 1.0f, 100, N, 4, spec, n_spec, &ngram);
    spec_run(f, "ngram", 1.0f, which, N, 100, plain, n_plain, 0);
    for (int i = 0; i < N; i++) {
        if (n_spec[i] != n_plain[i] || memcmp(spec[i], plain[i], sizeof(int32_t) * (size_t)n_plain[i]))
            fail_msg("grammar %d: the scheduler's sampled speculation differs from dsv4_spec_stream (%d vs %d tokens)", i,
                     n_spec[i], n_plain[i]);
        check_output(f, which[i], spec[i], n_spec[i], "scheduler speculation, sampled");
    }
}

static void test_request_errors(void **state) {
    fixture *f = *state;
    dsv4_sched *s;
    dsv4_error err;
    const dsv4_sched_opts so = { 1, 0 };
    assert_int_equal(dsv4_sched_new(f->m, &so, &s, &err), 0);
    int32_t p[1] = { 5 };
    dsv4_request r = { p, 1, { 0.0f, 0, 1.0f, 0.0f, 1 }, 10, 1, NULL, 0, f->g[0], NULL };
    int64_t id;
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), DSV4_E_ARG);
    assert_non_null(strstr(err.msg, "grammar and a vocabulary"));
    /* a budget below the shortest value of schema 0 ({"name":"","age":0} needs 19 bytes): EOS at once, and the
     * finish reason says the budget ran out */
    r.cvocab = f->v;
    r.max_new_tokens = 5;
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), 0);
    while (dsv4_sched_pending(s) > 0) assert_int_equal(dsv4_sched_step(s, &err), 0);
    dsv4_req_result res;
    assert_int_equal(dsv4_sched_result(s, id, &res, &err), 0);
    assert_int_equal(res.finish, DSV4_FINISH_LENGTH);
    assert_int_equal(res.n_tokens, 1);
    assert_int_equal(res.tokens[0], f->eos);
    /* 19 tokens of budget hold the value and EOS: byte tokens of the shortest value, then EOS */
    r.max_new_tokens = 20;
    assert_int_equal(dsv4_sched_add(s, &r, &id, &err), 0);
    while (dsv4_sched_pending(s) > 0) assert_int_equal(dsv4_sched_step(s, &err), 0);
    assert_int_equal(dsv4_sched_result(s, id, &res, &err), 0);
    assert_int_equal(res.finish, DSV4_FINISH_EOS);
    check_output(f, 0, res.tokens, res.n_tokens, "tight budget");
    dsv4_sched_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_streams),
        cmocka_unit_test(test_termination),
        cmocka_unit_test(test_shared_matchers),
        cmocka_unit_test(test_speculative),
        cmocka_unit_test(test_sched_speculative),
        cmocka_unit_test(test_request_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
