/* Closed forms of counted repetitions (src/engine/constraint_count.c) against the brute force.
 *
 * The vocabulary is made of JSON string pieces: ASCII letters, quotes followed by what may come after a string
 * (',' '}' ']' ':'), escapes whole and cut (\n, \", \u00e9, \u12, a lone backslash), UTF-8 characters of 2, 3
 * and 4 bytes whole and cut, control bytes, '<', and long runs of one letter (past the table's rows), plus every
 * single byte. The grammars are counted strings (maxLength 0 .. 9, 12, 25; minLength with and without
 * maxLength) as values, array items and property values followed by other members; extra keys; '<'-escaped
 * strings; and GBNF repetitions: plain, at the end of the output, nested, with a class containing the quote,
 * whose exit overlaps the class (which must not use a closed form) and of an ambiguous x (no table).
 *
 * Streams walk each grammar: random tokens, and walks that take one-character tokens so that they pass every
 * count of a bounded string (0 .. maxLength + 1 characters left), with and without a tight length bound. At
 * every step every token's bit in the mask must equal its own answer (dsv4_cstate_allows walks the token's bytes
 * on the automaton and never uses a table). The closed forms must have answered masks (count_forms > 0), with the
 * vocabulary's tables (dsv4_cvocab_prepare_json) and with the matcher's own; and never for the grammars where
 * they do not apply. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/constraint_pda.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"

static uint64_t rng_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

enum { V = 1800, EOS_ID = 1799 };

/* Pieces tokens are made of (several per token). */
static const char *const PIECES[] = {
    "a", "b", "z", " ", "ab", "the", "\"", "\",", "\"}", "\"]", "\":", ",", "}", "]", ":", "{", "[", "0", "7",
    "\\n", "\\\"", "\\\\", "\\u00e9", "\\u12", "\\u", "\\", "\xc3\xa9", "\xc3", "\xa9", "\xe6\x97\xa5", "\xe6\x97",
    "\xf0\x9f\x98\x80", "\xf0\x9f", "\n", "\x01", "<", ".", "!", "-", "x",
};

/* Tokens every vocabulary here has (after the single bytes): the ones whose answer the closed form's checks
 * decide in the GBNF cases below. */
static const char *const FIXED[] = {
    "b!", "ab.", "abc.", "abcd.", "bb!", "dz", "dza", "<d", "<dx", "a!", "aa", "\",", "aaaa\"", "\\u00e9\"}",
    "ab!", "aab!", "abab", "b!!", "<ab", "<abc!", "abca", "cab!",
    " a", " ab", " ab.", "  a", " a b", " .", "A: ", "A: a", ": a", ":a", "A:", "xa", "xab", "xab!", "xb", "xbc", "xbcc!", "aabb!",
};

static dsv4_cvocab *make_vocab(void) {
    static char pool[V * 64];
    static const char *bytes[V];
    static size_t lens[V];
    uint64_t rng = 4242;
    size_t at = 0;
    const int n_pieces = (int)(sizeof PIECES / sizeof *PIECES);
    for (int i = 0; i < V; i++) {
        bytes[i] = pool + at;
        if (i < 256) { pool[at++] = (char)i; lens[i] = 1; continue; }
        if (i == EOS_ID) { bytes[i] = NULL; lens[i] = 0; continue; }
        if (i - 256 < (int)(sizeof FIXED / sizeof *FIXED)) {
            const size_t k = strlen(FIXED[i - 256]);
            memcpy(pool + at, FIXED[i - 256], k);
            at += k;
            lens[i] = k;
            continue;
        }
        size_t n = 0;
        if (i % 40 == 0) {                       /* a run of one letter, 10 .. 33 long */
            const size_t k = 10 + rng_next(&rng) % 24;
            for (; n < k; n++) pool[at + n] = i % 80 ? 'a' : 'b';
            if (i % 120 == 0) pool[at + n++] = '"';
        } else {
            const int k = 1 + (int)(rng_next(&rng) % 4);
            for (int j = 0; j < k; j++) {
                const char *p = PIECES[i % 3 == 0 ? rng_next(&rng) % 6 : rng_next(&rng) % (uint64_t)n_pieces];
                memcpy(pool + at + n, p, strlen(p));
                n += strlen(p);
            }
        }
        at += n;
        lens[i] = n;
    }
    dsv4_cvocab *v;
    dsv4_error err;
    if (dsv4_cvocab_new(bytes, lens, V, EOS_ID, &v, &err)) fail_msg("vocab: %s", err.msg);
    return v;
}

typedef struct { const char *text; int kind; int closed; } grammar_case;  /* kind: 0 schema, 1 '<'-escaped schema, 2 GBNF;
                                                                          * closed: 1 must use closed forms, 0 must not, -1 either */

static const grammar_case CASES[] = {
    {"{\"type\":\"string\",\"maxLength\":0}", 0, -1},
    {"{\"type\":\"string\",\"maxLength\":1}", 0, -1},
    {"{\"type\":\"string\",\"maxLength\":2}", 0, 1},
    {"{\"type\":\"string\",\"maxLength\":3}", 0, 1},
    {"{\"type\":\"string\",\"maxLength\":5}", 0, 1},
    {"{\"type\":\"string\",\"maxLength\":9}", 0, 1},
    {"{\"type\":\"string\",\"maxLength\":25}", 0, 1},
    {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":6}", 0, 1},
    {"{\"type\":\"string\",\"minLength\":4}", 0, 1},
    {"{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":4},\"maxItems\":3}", 0, 1},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":12},\"b\":{\"type\":\"integer\"},"
     "\"c\":{\"type\":\"string\",\"maxLength\":7}},\"required\":[\"a\",\"b\"]}", 0, 1},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\",\"maxLength\":3}}", 0, 1},
    {"{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"string\"}},\"additionalProperties\":{\"type\":\"integer\"}}", 0, 1},
    {"{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\",\"maxLength\":6}},\"additionalProperties\":{\"type\":\"string\"}}", 1, 1},
    {"", 0, 1},                              /* JSON mode */
    {"root ::= [a-z]{2,7} \".\"\n", 2, 1},
    {"root ::= \"x\" [a-z ]{0,5}\n", 2, -1},
    {"root ::= ([a-z]{1,3} \",\"){2,4}\n", 2, 1},
    {"root ::= \"<\" [ab\"]{0,6} \"!\"\n", 2, 1},
    {"root ::= [^\"\\\\!]{0,6} \"!\"\n", 2, 1},
    {"root ::= [^\"\\\\]{0,6} \"!\"\n", 2, 0},  /* '!' is in the class too: no closed form */
    {"root ::= [a-c]{1,4} [a-z] \".\"\n", 2, 0},  /* the exit reads bytes of the class: no closed form */
    {"root ::= (\"a\" | \"ab\"){1,4} \".\"\n", 2, 0},  /* x is not prefix-free: no table */
    {"root ::= w{0,4} \"!\"\nw ::= \"a\" w | \"b\"\n", 2, 1},   /* inside x the configuration comes back to x's start */
    {"root ::= \"<\" [a-c]{3} \"!\"\n", 2, 1},                  /* mandatory x's only (first ones keyed by the real configuration) */
    /* one literal byte before the repetition, itself an x (the form after that byte) or not */
    {"root ::= \"A: \" [a-z ]{1,8} \".\"\n", 2, 1},
    {"root ::= \"x\" (\"a\" | \"b\") [a-c]{2,5} \"!\"\n", 2, 1},
    {"root ::= \"x\" (\"a\" | \"b\") [a-c]{0,5} \"!\"\n", 2, 1},
    {"root ::= \"A:\" [a-z]{1,8} \".\"\n", 2, -1},
    /* untruncated configurations (the stacks share no node): the checks that keep the form exact */
    {"root ::= [a-c]{2,4} [a-z] \".\" | \"d\" \"!\"\n", 2, 0},        /* the continuation reads bytes of x */
    {"root ::= [a-c]{2,4} \".\" | \"b\" \"!\"\n", 2, -1},              /* the other stacks read bytes of x */
    {"root ::= \"<\" (\"a\" | \"dz\"){0,4} \"!\" | \"<dx\"\n", 2, -1},  /* inside an x, not at its start */
    {NULL, 0, 0}};

static dsv4_grammar *compile(const grammar_case *c) {
    dsv4_grammar *g;
    dsv4_error err;
    const dsv4_schema_opts o = { 1, c->kind == 1 };
    int rc;
    if (c->kind == 2) rc = dsv4_grammar_from_gbnf(c->text, strlen(c->text), &g, &err);
    else if (!c->text[0]) rc = dsv4_grammar_json_any(&o, &g, &err);
    else rc = dsv4_grammar_from_schema_text(c->text, strlen(c->text), &o, &g, &err);
    if (rc) fail_msg("%s: %s", c->text, err.msg);
    return g;
}

/* The mask against every token's own answer; the allowed ids into allowed. Returns how many. */
static int check_mask(dsv4_cstate *s, uint64_t *bits, int32_t *allowed, const char *what, int step) {
    dsv4_error err;
    assert_int_equal(dsv4_cstate_allowed(s, bits, &err), 0);
    int n = 0;
    for (int32_t id = 0; id < V; id++) {
        const int bit = (int)((bits[id >> 6] >> (id & 63)) & 1);
        if (bit != dsv4_cstate_allows(s, id))
            fail_msg("%s step %d token %d: mask says %d, its own answer is %d", what, step, id, bit, !bit);
        if (bit) allowed[n++] = id;
    }
    assert_true(n > 0);
    return n;
}

/* One stream on m: mode 0 random tokens; mode 1 mostly one-byte tokens (half the time the smallest allowed
 * byte, so that a string opens alone and passes every count). Length bound max_bytes. */
static void run_stream(dsv4_cmatcher *m, const dsv4_cvocab *v, int64_t max_bytes, int mode, uint64_t seed, const char *what,
                       uint64_t *bits, int32_t *allowed) {
    dsv4_error err;
    dsv4_cstate *s;
    assert_int_equal(dsv4_cstate_new_shared(m, max_bytes, &s, &err), 0);
    uint64_t rng = seed;
    for (int step = 0; step < 60 && !dsv4_cstate_finished(s); step++) {
        const int n = check_mask(s, bits, allowed, what, step);
        int32_t pick = allowed[rng_next(&rng) % (uint64_t)n];
        if (mode == 1 && rng_next(&rng) % 8 != 0) {
            int n1 = 0;
            for (int i = 0; i < n; i++) {
                size_t len;
                const char *b = dsv4_cvocab_bytes(v, allowed[i], &len);
                if (b && len == 1) allowed[n1++] = allowed[i];
            }
            if (n1) pick = allowed[rng_next(&rng) % 2 ? 0 : rng_next(&rng) % (uint64_t)n1];
        }
        assert_int_equal(dsv4_cstate_advance(s, pick, &err), 0);
    }
    dsv4_cstate_free(s);
}

static void run_cases(dsv4_cvocab *v, int64_t *forms_total) {
    uint64_t *bits = malloc(sizeof *bits * ((V + 63) / 64));
    int32_t *allowed = malloc(sizeof *allowed * V);
    dsv4_error err;
    for (int ci = 0; CASES[ci].text; ci++) {
        dsv4_grammar *g = compile(&CASES[ci]);
        dsv4_cmatcher *m;
        assert_int_equal(dsv4_cmatcher_new(g, v, &m, &err), 0);
        m->sig_probe = 0;   /* every wide-or-narrow configuration may take the closed form */
        for (int seed = 0; seed < 6; seed++) {
            run_stream(m, v, -1, seed % 2, 100u * (uint64_t)ci + (uint64_t)seed, CASES[ci].text, bits, allowed);
            run_stream(m, v, 6 + 5 * seed, seed % 2, 7u + 31u * (uint64_t)ci + (uint64_t)seed, CASES[ci].text, bits, allowed);
        }
        dsv4_cstate *probe;
        assert_int_equal(dsv4_cstate_new_shared(m, -1, &probe, &err), 0);
        dsv4_cstate_stats st;
        dsv4_cstate_get_stats(probe, &st);
        if (CASES[ci].closed == 1 && st.count_forms == 0) fail_msg("%s: no closed form was used", CASES[ci].text);
        if (CASES[ci].closed == 0 && st.count_forms != 0) fail_msg("%s: a closed form was used", CASES[ci].text);
        *forms_total += st.count_forms;
        dsv4_cstate_free(probe);
        dsv4_cmatcher_free(m);
        dsv4_grammar_free(g);
    }
    free(bits);
    free(allowed);
}

/* The matchers' own tables (the vocabulary has none). */
static void test_own_tables(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    int64_t forms = 0;
    run_cases(v, &forms);
    assert_true(forms > 0);
    dsv4_cvocab_free(v);
}

/* The vocabulary's tables, found by comparing rules; the same masks. */
static void test_vocab_tables(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    dsv4_error err;
    assert_int_equal(dsv4_cvocab_prepare_json(v, &err), 0);
    assert_non_null(v->count_shelf);
    int64_t forms = 0;
    run_cases(v, &forms);
    assert_true(forms > 0);
    /* a fresh matcher's first bounded string is answered by a closed form (the probe is on: from a table it did
     * not build, as it builds its own only for configurations the probe finds wide) */
    const grammar_case c = { "{\"type\":\"string\",\"maxLength\":5}", 0, 1 };
    dsv4_grammar *g = compile(&c);
    dsv4_cstate *s;
    assert_int_equal(dsv4_cstate_new(g, v, -1, &s, &err), 0);
    assert_int_equal(dsv4_cstate_advance(s, '"', &err), 0);
    uint64_t *bits = malloc(sizeof *bits * ((V + 63) / 64));
    int32_t *allowed = malloc(sizeof *allowed * V);
    check_mask(s, bits, allowed, c.text, 0);
    dsv4_cstate_stats st;
    dsv4_cstate_get_stats(s, &st);
    assert_int_equal(st.count_forms, 1);
    dsv4_cstate_free(s);
    dsv4_grammar_free(g);
    free(bits);
    free(allowed);
    dsv4_cvocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_tables),
        cmocka_unit_test(test_vocab_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
