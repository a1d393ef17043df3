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
 * stale slot would show). The stored walks must have served some masks, whole and partly; the same with the
 * vocabulary's own string walks (dsv4_cvocab_prepare_json), which serve a fresh matcher's first string.
 *
 * The matcher cache (constraint_cache.c, used by the scheduler): the same schema compiled twice gets the same
 * matcher, schemas that differ in one number get different ones, and masks from cached matchers, used
 * alternately for two schemas and after the caller's grammars are freed, equal those of private matchers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/constraint_cache.h"
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

/* Every grammar, two interleaved seeds' worth of streams, masks against each token's own answer; the matchers'
 * shared-walk counts are added to *shared / *partial. */
static void run_exact(const dsv4_cvocab *v, int64_t *shared, int64_t *partial) {
    uint64_t *bits = malloc(sizeof *bits * ((V + 63) / 64));
    int32_t *allowed = malloc(sizeof *allowed * V);
    dsv4_error err;
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
        *shared += st.shared_walks;
        *partial += st.shared_partial;
        dsv4_cstate_free(probe);
        dsv4_cmatcher_free(m);
        dsv4_cmatcher_free(mh);
        dsv4_grammar_free(g);
        dsv4_grammar_free(h);
    }
    free(bits);
    free(allowed);
}

static void test_shared_walks_exact(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    int64_t shared = 0, partial = 0;
    run_exact(v, &shared, &partial);
    /* the paths under test ran */
    assert_true(shared > 0);
    assert_true(partial > 0);
    dsv4_cvocab_free(v);
}

/* With the vocabulary's own string walks and count tables (dsv4_cvocab_prepare_json): the first string of a
 * fresh JSON-mode matcher is served by its count table, or by the stored walk without the tables (no walk of
 * its own either way), and every mask still equals the tokens' own answers. */
static void test_vocab_walks(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    dsv4_error err;
    assert_int_equal(dsv4_cvocab_prepare_json(v, &err), 0);
    dsv4_grammar *g = compile("true", 0);
    uint64_t *bits = malloc(sizeof *bits * ((V + 63) / 64));
    int32_t *allowed = malloc(sizeof *allowed * V);
    /* the vocabulary's count tables (constraint_count.c) answer first; without them, its stored walks */
    struct count_shelf *tables = v->count_shelf;
    for (int with_tables = 1; with_tables >= 0; with_tables--) {
        v->count_shelf = with_tables ? tables : NULL;
        dsv4_cmatcher *m;
        assert_int_equal(dsv4_cmatcher_new(g, v, &m, &err), 0);
        m->sig_probe = 0;
        dsv4_cstate *s;
        assert_int_equal(dsv4_cstate_new_shared(m, -1, &s, &err), 0);
        assert_int_equal(dsv4_cstate_advance(s, '[', &err), 0);
        assert_int_equal(dsv4_cstate_advance(s, '"', &err), 0);
        stream st = { s, 1, 0 };
        step(&st, v, bits, allowed);
        dsv4_cstate_stats stats;
        dsv4_cstate_get_stats(s, &stats);
        assert_int_equal(stats.mask_walks, 1);
        assert_int_equal(stats.shared_walks, !with_tables);
        assert_int_equal(stats.count_forms, with_tables);
        assert_int_equal(stats.trie_nodes_visited, 0);
        dsv4_cstate_free(s);
        dsv4_cmatcher_free(m);
    }
    v->count_shelf = tables;
    dsv4_grammar_free(g);
    free(bits);
    free(allowed);
    int64_t shared = 0, partial = 0;
    run_exact(v, &shared, &partial);
    assert_true(shared > 0);
    dsv4_cvocab_free(v);
}

/* Steps of a stream on a cached matcher and one on a private matcher of the same grammar: equal masks. */
static void same_masks(dsv4_cmatcher *cached, const dsv4_grammar *g, const dsv4_cvocab *v, uint64_t seed, uint64_t *a, uint64_t *b,
                       int32_t *allowed) {
    dsv4_error err;
    dsv4_cstate *sc, *sp;
    assert_int_equal(dsv4_cstate_new_shared(cached, 90, &sc, &err), 0);
    assert_int_equal(dsv4_cstate_new(g, v, 90, &sp, &err), 0);
    while (!dsv4_cstate_finished(sc)) {
        assert_int_equal(dsv4_cstate_allowed(sc, a, &err), 0);
        assert_int_equal(dsv4_cstate_allowed(sp, b, &err), 0);
        assert_memory_equal(a, b, sizeof *a * ((V + 63) / 64));
        int n = 0;
        for (int32_t id = 0; id < V; id++)
            if ((a[id >> 6] >> (id & 63)) & 1) allowed[n++] = id;
        const int32_t tok = allowed[rng_next(&seed) % (uint64_t)n];
        assert_int_equal(dsv4_cstate_advance(sc, tok, &err), 0);
        assert_int_equal(dsv4_cstate_advance(sp, tok, &err), 0);
    }
    dsv4_cstate_free(sc);
    dsv4_cstate_free(sp);
}

static void test_matcher_cache(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    uint64_t *a = malloc(sizeof *a * ((V + 63) / 64)), *b = malloc(sizeof *b * ((V + 63) / 64));
    int32_t *allowed = malloc(sizeof *allowed * V);
    dsv4_error err;
    static const char five[] = "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"maxLength\":5}},\"required\":[\"s\"]}";
    static const char six[] = "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"maxLength\":6}},\"required\":[\"s\"]}";
    dsv4_grammar *g5 = compile(five, 0), *g5b = compile(five, 0), *g6 = compile(six, 0), *gj = compile("true", 0);
    dsv4_grammar *copy = dsv4_grammar_copy(g6);
    assert_non_null(copy);
    assert_true(dsv4_grammar_same(copy, g6));
    assert_true(dsv4_grammar_hash(copy) == dsv4_grammar_hash(g6));
    assert_true(dsv4_grammar_same(g5, g5b));
    assert_false(dsv4_grammar_same(g5, g6));
    dsv4_grammar_free(copy);
    dsv4_cmcache *c;
    assert_int_equal(dsv4_cmcache_new((size_t)1 << 30, 2, &c, &err), 0);
    dsv4_cmatcher *m5, *m5b, *m6, *mj;
    assert_int_equal(dsv4_cmcache_get(c, g5, v, &m5, &err), 0);
    assert_int_equal(dsv4_cmcache_get(c, g5b, v, &m5b, &err), 0);
    assert_ptr_equal(m5, m5b);                       /* the same schema: the same matcher */
    assert_int_equal(dsv4_cmcache_hits(c), 1);
    assert_int_equal(dsv4_cmcache_get(c, g6, v, &m6, &err), 0);
    assert_ptr_not_equal(m5, m6);                    /* maxLength 5 and 6 differ */
    /* alternating the two schemas (and two streams on the first) against private matchers */
    for (int seed = 0; seed < 6; seed++) {
        same_masks(m5, g5, v, 10 + (uint64_t)seed, a, b, allowed);
        same_masks(m6, g6, v, 20 + (uint64_t)seed, a, b, allowed);
        same_masks(m5b, g5b, v, 30 + (uint64_t)seed, a, b, allowed);
    }
    /* all pinned: a third grammar goes past max_entries, and comes back down once released */
    assert_int_equal(dsv4_cmcache_get(c, gj, v, &mj, &err), 0);
    assert_int_equal(dsv4_cmcache_entries(c), 3);
    same_masks(mj, gj, v, 5, a, b, allowed);
    dsv4_cmcache_release(c, mj);
    assert_int_equal(dsv4_cmcache_entries(c), 2);    /* the unpinned one goes */
    dsv4_cmcache_release(c, m5);
    dsv4_cmcache_release(c, m5b);
    dsv4_cmcache_release(c, m6);
    /* the cache owns copies: the callers' grammars may go */
    dsv4_grammar_free(g5b);
    dsv4_grammar_free(g6);
    g6 = compile(six, 0);
    dsv4_cmatcher *again;
    assert_int_equal(dsv4_cmcache_get(c, g6, v, &again, &err), 0);
    assert_ptr_equal(again, m6);
    same_masks(again, g6, v, 40, a, b, allowed);
    dsv4_cmcache_release(c, again);
    dsv4_cmcache_free(c);
    dsv4_grammar_free(g5);
    dsv4_grammar_free(g6);
    dsv4_grammar_free(gj);
    free(a);
    free(b);
    free(allowed);
    dsv4_cvocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_walks_exact),
        cmocka_unit_test(test_vocab_walks),
        cmocka_unit_test(test_matcher_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
