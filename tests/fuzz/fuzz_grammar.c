/* The GBNF-like grammar compiler (engine/grammar.c), then constrained decoding over it (engine/constraint*.c).
 * Input: the grammar's text. Fixture: the small vocabulary of lib/constraint_walk.c (the 256 single bytes, a
 * few multi-byte tokens, EOS last), built once.
 * Invariants: an error is a negative status with a one-line message; a grammar that compiles can be walked
 * (lib/constraint_walk.h: mask and allows agree, something is allowed until EOS, allowed tokens are accepted
 * and fit the length bound, rollback restores the mask, the stream finishes within its byte budget); an output
 * that ends with EOS on a complete value is well-formed UTF-8 (grammar.h: characters are scalar values). */
#include "fuzz.h"
#include "engine/grammar.h"
#include "lib/constraint_walk.h"
#include <stdlib.h>

/* 1 when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or values past U+10FFFF). */
static int utf8_ok(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const unsigned c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return 0;
        if (i + k >= n) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j <= k; j++) if (s[i + j] < 0x80 || s[i + j] > 0xBF) return 0;
        i += k + 1;
    }
    return 1;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fuzz_cvocab();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsv4_grammar *g = NULL;
    dsv4_error err = {0};
    const int rc = dsv4_grammar_from_gbnf((const char *)data, size, &g, &err);
    if (rc) {
        fuzz_check_error(rc, &err);
        FUZZ_CHECK(!g, "a failed compile returned a grammar");
        return 0;
    }
    char *out;
    size_t n;
    int complete;
    fuzz_constraint_walk(g, data, size, &out, &n, &complete);
    if (out && complete) FUZZ_CHECK(utf8_ok((const unsigned char *)out, n), "output is not UTF-8: %s", out);
    free(out);
    dsv4_grammar_free(g);
    return 0;
}
