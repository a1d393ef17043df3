/* Stored context-independent walks shared between configurations (src/engine/constraint_sig.c).
 *
 * The matchers here have the narrow-configuration probe turned off, so every context-independent walk goes
 * through a stored walk: built, reused whole, or reused up to a depth with the rest walked. The vocabulary has
 * random tokens of 1 to 30 bytes over JSON's alphabet with UTF-8 pieces (tokens longer than the depth lists of
 * constraint_vocab.h, which a partial reuse continues below), and the grammars have counted repetitions (each
 * count a new configuration that behaves like the last one up to its bound). At every step of random walks,
 * every token's bit in the mask must equal its own answer (dsv4_cstate_allows, which walks the token's bytes
 * and never uses a stored walk), for two streams on one matcher with different length bounds, interleaved
 * with a stream of another grammar on another matcher (so a stored walk serving the wrong configuration or a
 * stale slot would show). The stored walks must have served some masks, whole and partly. */
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

enum { V = 3000, EOS_ID = 299, SPECIAL_ID = 300 };

static dsv4_cvocab *make_vocab(void) {
    static const char alpha[] = "abcxyz  \"\\{}[]:,.0123456789-eEtrufalsn\n\xc3\xa9\xe6\x97\xa5";
    static char pool[V * 32];
    static const char *bytes[V];
    static size_t lens[V];
    uint64_t rng = 777;
    size_t at = 0;
    for (int i = 0; i < V; i++) {
        if (i < 256) { pool[at] = (char)i; bytes[i] = pool + at; lens[i] = 1; at++; continue; }
        /* mostly short, some past the 16-byte depth lists; a few long runs of one letter or spaces */
        size_t n = 2 + rng_next(&rng) % 6;
        if (i % 7 == 0) n = 10 + rng_next(&rng) % 21;
        bytes[i] = pool + at;
        if (i % 31 == 0)
            for (size_t k = 0; k < n; k++) pool[at++] = i % 2 ? 'a' : ' ';
        else
            for (size_t k = 0; k < n; k++) pool[at++] = alpha[rng_next(&rng) % (sizeof alpha - 1)];
        lens[i] = n;
    }
    bytes[SPECIAL_ID] = NULL; /* an added token: never allowed */
    lens[SPECIAL_ID] = 0;
    dsv4_cvocab *v;
    dsv4_error err;
    if (dsv4_cvocab_new(bytes, lens, V, EOS_ID, &v, &err)) fail_msg("vocab: %s", err.msg);
    return v;
}

static dsv4_grammar *compile(const char *text, int gbnf) {
    dsv4_grammar *g;
    dsv4_error err;
    const dsv4_schema_opts o = { 1 };
    const int rc = gbnf ? dsv4_grammar_from_gbnf(text, strlen(text), &g, &err)
                        : dsv4_grammar_from_schema_text(text, strlen(text), &o, &g, &err);
    if (rc) fail_msg("%s: %s", text, err.msg);
    return g;
}

static const struct { const char *text; int gbnf; } GRAMMARS[] = {
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"string\",\"maxLength\":7},"
     "\"c\":{\"type\":\"string\",\"maxLength\":40},\"d\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":3},"
     "\"e\":{\"type\":\"string\",\"pattern\":\"^[a-z]{2,25}$\"}},\"required\":[\"a\",\"b\",\"c\"]}", 0},
    {"root ::= \"x: \" [a-z \\n]{1,60} \".\" tail\ntail ::= \"\" | \" \" [0-9]{3,30}\n", 1},
    {"true", 0},
    {NULL, 0}};

typedef struct {
    dsv4_cstate *s;
    uint64_t rng;
    int steps;
} stream;

/* One step: the mask against every token's own answer, then a random allowed token. 1 when the stream ended. */
static int step(stream *st, const dsv4_cvocab *v, uint64_t *bits, int32_t *allowed) {
    dsv4_error err;
    if (dsv4_cstate_finished(st->s)) return 1;
    assert_int_equal(dsv4_cstate_allowed(st->s, bits, &err), 0);
    int n = 0;
    for (int32_t id = 0; id < V; id++) {
        const int bit = (int)((bits[id >> 6] >> (id & 63)) & 1);
        if (bit != dsv4_cstate_allows(st->s, id)) fail_msg("step %d token %d: mask says %d, its own answer is %d", st->steps, id, bit, !bit);
        if (bit) allowed[n++] = id;
    }
    assert_true(n > 0);
    assert_false((bits[SPECIAL_ID >> 6] >> (SPECIAL_ID & 63)) & 1);
    assert_int_equal(dsv4_cstate_advance(st->s, allowed[rng_next(&st->rng) % (uint64_t)n], &err), 0);
    st->steps++;
    return 0;
}

static void test_shared_walks_exact(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    uint64_t *bits = malloc(sizeof *bits * (V + 63) / 64);
    int32_t *allowed = malloc(sizeof *allowed * V);
    dsv4_error err;
    int64_t shared = 0, partial = 0;
    for (int gi = 0; GRAMMARS[gi].text; gi++) {
        const int gj = GRAMMARS[gi + 1].text ? gi + 1 : 0;   /* the other grammar, interleaved */
        dsv4_grammar *g = compile(GRAMMARS[gi].text, GRAMMARS[gi].gbnf), *h = compile(GRAMMARS[gj].text, GRAMMARS[gj].gbnf);
        dsv4_cmatcher *m, *mh;
        assert_int_equal(dsv4_cmatcher_new(g, v, &m, &err), 0);
        assert_int_equal(dsv4_cmatcher_new(h, v, &mh, &err), 0);
        m->sig_probe = 0;
        mh->sig_probe = 0;
        for (int seed = 0; seed < 4; seed++) {
            stream a = { NULL, 11u + (uint64_t)seed * 3 + (uint64_t)gi, 0 }, b = { NULL, 5000u + (uint64_t)seed, 0 },
                   o = { NULL, 90u + (uint64_t)seed, 0 };
            assert_int_equal(dsv4_cstate_new_shared(m, 80 + 40 * seed, &a.s, &err), 0);
            assert_int_equal(dsv4_cstate_new_shared(m, 30 + 7 * seed, &b.s, &err), 0);
            assert_int_equal(dsv4_cstate_new_shared(mh, 120, &o.s, &err), 0);
            int done = 0;
            while (done != 7) {
                if (!(done & 1) && step(&a, v, bits, allowed)) done |= 1;
                if (!(done & 4) && step(&o, v, bits, allowed)) done |= 4;
                if (!(done & 2) && step(&b, v, bits, allowed)) done |= 2;
            }
            dsv4_cstate_free(a.s);
            dsv4_cstate_free(b.s);
            dsv4_cstate_free(o.s);
        }
        dsv4_cstate *probe;
        assert_int_equal(dsv4_cstate_new_shared(m, -1, &probe, &err), 0);
        dsv4_cstate_stats st;
        dsv4_cstate_get_stats(probe, &st);
        shared += st.shared_walks;
        partial += st.shared_partial;
        dsv4_cstate_free(probe);
        dsv4_cmatcher_free(m);
        dsv4_cmatcher_free(mh);
        dsv4_grammar_free(g);
        dsv4_grammar_free(h);
    }
    /* the paths under test ran */
    assert_true(shared > 0);
    assert_true(partial > 0);
    free(bits);
    free(allowed);
    dsv4_cvocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_walks_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
