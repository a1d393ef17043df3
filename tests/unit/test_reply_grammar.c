/* The reply grammar of response_format in thinking mode (engine/reply_grammar.h): random walks under the
 * constraint ("any allowed token uniformly", with a bias towards the pieces of "</think>" written as ordinary
 * text), on a vocabulary where </think> is a special token and also "</think>", "</thi", "nk>", ... are ordinary
 * text tokens. Every walk that ends with EOS is split the way the server splits a reply (at the first "</think>"
 * of the text, src/server/output.c): the split must fall exactly on the special token, and the answer must parse
 * (jansson) and validate against the schema (tests/unit/helpers/mini_validator.c, independent of the schema
 * compiler). Plus token-by-token cases: reasoning may hold '<', "</thi" and the like, never "</think>" as text;
 * without thinking the grammar is the plain JSON one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "engine/constraint.h"
#include "engine/reply_grammar.h"
#include "text/chat.h"
#include "helpers/mini_validator.h"

enum { EOS = 256, THINK_END = 258, FIRST_MULTI = 259 };
/* tricky ones first (the walk favours them): the marker's text and its pieces */
static const char *const MULTI[] = { "</think>", "</thi", "nk>", "</", "think>", "<", "/", "k>", "think",
                                     "{", "}", "\"", "\"name\"", "\"age\"", ":", ",", "12", "true", "null", "[", "]", NULL };
enum { N_TRICKY = 9 };

static dsv4_cvocab *make_vocab(int *n_out) {
    const char *bytes[400] = {0};
    size_t lens[400] = {0};
    static char single[256];
    for (int i = 0; i < 256; i++) { single[i] = (char)i; bytes[i] = &single[i]; lens[i] = 1; }
    int n = FIRST_MULTI;
    for (int i = 0; MULTI[i]; i++, n++) { bytes[n] = MULTI[i]; lens[n] = strlen(MULTI[i]); }
    dsv4_cvocab *v;
    dsv4_error err;
    if (dsv4_cvocab_new(bytes, lens, n, EOS, &v, &err)) fail_msg("vocab: %s", err.msg);
    if (dsv4_cvocab_add_special(v, DSV4_THINK_END_TEXT, strlen(DSV4_THINK_END_TEXT), THINK_END, &err))
        fail_msg("special: %s", err.msg);
    *n_out = n;
    return v;
}

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17;
    return *x;
}

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"age\":{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":150},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"</think>\"]},\"maxItems\":2}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

/* One walk; returns 1 when it ended with a complete reply (checked), 0 when the length bound cut it. */
static int walk(const dsv4_grammar *g, const dsv4_cvocab *v, const json_t *schema, uint64_t seed, int64_t max_bytes,
                int *reasoning_had_lt) {
    dsv4_error err;
    dsv4_cstate *s;
    assert_int_equal(dsv4_cstate_new(g, v, max_bytes, &s, &err), 0);
    const int V = dsv4_cvocab_size(v);
    uint64_t *bits = malloc(sizeof *bits * (size_t)((V + 63) / 64));
    int32_t *allowed = malloc(sizeof *allowed * (size_t)V), *tricky = malloc(sizeof *tricky * (size_t)V);
    char *text = malloc(1 << 16);
    size_t n = 0, at_marker = (size_t)-1;
    uint64_t rng = seed * 2654435761u + 7;
    int complete = 0;
    for (;;) {
        assert_int_equal(dsv4_cstate_allowed(s, bits, &err), 0);
        int k = 0, kt = 0;
        for (int32_t id = 0; id < V; id++)
            if ((bits[id >> 6] >> (id & 63)) & 1) {
                allowed[k++] = id;
                if ((id >= FIRST_MULTI && id < FIRST_MULTI + N_TRICKY) || id == '<') tricky[kt++] = id;
            }
        assert_true(k > 0);
        /* the ordinary token "</think>" is never allowed before the marker */
        if (at_marker == (size_t)-1) assert_false(dsv4_cstate_allows(s, FIRST_MULTI));
        const uint64_t r = rng_next(&rng) % 16;
        int32_t tok;
        if (r < 6 && kt) tok = tricky[rng_next(&rng) % (uint64_t)kt];
        else if (r == 6 && dsv4_cstate_allows(s, THINK_END)) tok = THINK_END;
        else tok = allowed[rng_next(&rng) % (uint64_t)k];
        if (tok == EOS) complete = dsv4_cstate_complete(s);
        assert_int_equal(dsv4_cstate_advance(s, tok, &err), 0);
        if (tok == EOS) break;
        size_t len;
        const char *b = dsv4_cvocab_bytes(v, tok, &len);
        if (tok == THINK_END) {
            assert_true(at_marker == (size_t)-1);
            at_marker = n;
            b = DSV4_THINK_END_TEXT;
            len = strlen(b);
        }
        assert_non_null(b);
        if (at_marker == (size_t)-1 && memchr(b, '<', len)) *reasoning_had_lt = 1;
        memcpy(text + n, b, len);
        n += len;
    }
    dsv4_cstate_free(s);
    free(bits);
    free(allowed);
    free(tricky);
    if (complete) {
        /* the server's split: the first "</think>" of the text */
        const char *mark = DSV4_THINK_END_TEXT;
        const size_t lm = strlen(mark);
        size_t split = (size_t)-1;
        for (size_t i = 0; i + lm <= n; i++)
            if (!memcmp(text + i, mark, lm)) { split = i; break; }
        if (split != at_marker) fail_msg("the text splits at %zd, the token is at %zd: %.*s", (ssize_t)split, (ssize_t)at_marker, (int)n, text);
        const char *ans = text + split + lm;
        const size_t na = n - split - lm;
        json_error_t je;
        json_t *val = json_loadb(ans, na, JSON_DECODE_ANY, &je);
        if (!val) fail_msg("answer not JSON (%s): %.*s", je.text, (int)na, ans);
        char why[200];
        if (schema && !mv_valid(schema, schema, val, why, sizeof why)) fail_msg("answer %.*s: %s", (int)na, ans, why);
        json_decref(val);
    }
    free(text);
    return complete;
}

static void random_replies_split_and_validate(void **state) {
    (void)state;
    int nv;
    dsv4_cvocab *v = make_vocab(&nv);
    json_error_t je;
    json_t *schema = json_loads(SCHEMA, 0, &je);
    assert_non_null(schema);
    dsv4_error err;
    for (int mode = 0; mode < 2; mode++) {   /* json_schema, json_object */
        dsv4_grammar *g;
        if (dsv4_grammar_json_reply(mode ? NULL : schema, NULL, 1, &g, &err)) fail_msg("%s", err.msg);
        int ended = 0, lt = 0;
        for (uint64_t seed = 1; seed <= 80; seed++) ended += walk(g, v, mode ? NULL : schema, seed * 13 + (uint64_t)mode, 400, &lt);
        /* the bound forces the end of thinking and a complete answer in time: every walk completes */
        if (ended < 80) fail_msg("mode %d: only %d of 80 walks completed", mode, ended);
        assert_true(lt);   /* the reasoning did hold '<' and pieces of the marker */
        dsv4_grammar_free(g);
    }
    json_decref(schema);
    dsv4_cvocab_free(v);
}

/* Feed tokens; returns the index of the first one refused (-1: all taken). */
static int feed(const dsv4_grammar *g, const dsv4_cvocab *v, const int32_t *toks, int n, int *complete) {
    dsv4_cstate *s;
    dsv4_error err;
    assert_int_equal(dsv4_cstate_new(g, v, 1000, &s, &err), 0);
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++) {
        if (!dsv4_cstate_allows(s, toks[i])) bad = i;
        else assert_int_equal(dsv4_cstate_advance(s, toks[i], &err), 0);
    }
    *complete = dsv4_cstate_complete(s);
    dsv4_cstate_free(s);
    return bad;
}

static void token_cases(void **state) {
    (void)state;
    int nv;
    dsv4_cvocab *v = make_vocab(&nv);
    dsv4_error err;
    dsv4_grammar *g, *plain;
    assert_int_equal(dsv4_grammar_json_reply(NULL, NULL, 1, &g, &err), 0);
    assert_int_equal(dsv4_grammar_json_reply(NULL, NULL, 0, &plain, &err), 0);
    const int32_t T_FULL = FIRST_MULTI, T_THI = FIRST_MULTI + 1, T_NK = FIRST_MULTI + 2, T_LTSL = FIRST_MULTI + 3,
                  T_THINKGT = FIRST_MULTI + 4, T_LBRACE = FIRST_MULTI + 9, T_RBRACE = FIRST_MULTI + 10;
    int complete;
    /* "</thi" + "nkx", "<<" + "/think!" (pieces of the marker, never all of it), the marker, then {} */
    const int32_t ok1[] = { 'a', '<', 'b', T_THI, 'n', 'k', 'x', '<', '<', '/', 't', 'h', 'i', 'n', 'k', '!', THINK_END, T_LBRACE, T_RBRACE };
    assert_int_equal(feed(g, v, ok1, 19, &complete), -1);
    assert_true(complete);
    /* reasoning may end with a piece of the marker's text right before the token */
    const int32_t ok2[] = { T_THI, THINK_END, '1' };
    assert_int_equal(feed(g, v, ok2, 3, &complete), -1);
    assert_true(complete);
    const int32_t ok3[] = { THINK_END, T_LBRACE, T_RBRACE };   /* empty reasoning */
    assert_int_equal(feed(g, v, ok3, 3, &complete), -1);
    /* never the text "</think>" before the token: as one token, in pieces, or after other text */
    const int32_t bad1[] = { 'x', T_FULL };
    assert_int_equal(feed(g, v, bad1, 2, &complete), 1);
    const int32_t bad2[] = { T_LTSL, T_THINKGT };
    assert_int_equal(feed(g, v, bad2, 2, &complete), 1);
    const int32_t bad3[] = { T_THI, T_NK };
    assert_int_equal(feed(g, v, bad3, 2, &complete), 1);
    const int32_t bad4[] = { '<', '<', '/', 't', 'h', 'i', 'n', 'k', '>' };
    assert_int_equal(feed(g, v, bad4, 9, &complete), 8);
    /* not JSON before the marker, not complete without it; after it, JSON only */
    const int32_t bad5[] = { T_LBRACE, T_RBRACE };
    assert_int_equal(feed(g, v, bad5, 2, &complete), -1);
    assert_false(complete);
    const int32_t bad6[] = { THINK_END, 'x' };
    assert_int_equal(feed(g, v, bad6, 2, &complete), 1);
    /* without thinking: the plain JSON grammar (no marker) */
    const int32_t p1[] = { T_LBRACE, T_RBRACE };
    assert_int_equal(feed(plain, v, p1, 2, &complete), -1);
    assert_true(complete);
    const int32_t p2[] = { THINK_END };
    assert_int_equal(feed(plain, v, p2, 1, &complete), 0);
    dsv4_grammar_free(g);
    dsv4_grammar_free(plain);
    dsv4_cvocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_replies_split_and_validate),
        cmocka_unit_test(token_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
