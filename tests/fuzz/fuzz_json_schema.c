/* JSON Schema -> grammar (engine/json_schema.c), then constrained decoding over it (engine/constraint*.c).
 * Input: the schema's text, compiled with the default options. Fixture: the small vocabulary of
 * lib/constraint_walk.c (the 256 single bytes, a few multi-byte tokens, EOS last), built once.
 * Invariants: an error is a negative status with a one-line message; a schema that compiles gives a grammar a
 * stream can walk (lib/constraint_walk.h: mask and allows agree, something is allowed until EOS, allowed tokens
 * are accepted and fit the length bound, rollback restores the mask, the stream finishes within its byte
 * budget); an output that ends with EOS on a complete value is JSON. */
#include "fuzz.h"
#include "engine/json_schema.h"
#include "lib/constraint_walk.h"
#include <jansson.h>
#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    fuzz_cvocab();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsv4_grammar *g = NULL;
    dsv4_error err = {0};
    const int rc = dsv4_grammar_from_schema_text((const char *)data, size, NULL, &g, &err);
    if (rc) {
        fuzz_check_error(rc, &err);
        FUZZ_CHECK(!g, "a failed compile returned a grammar");
        return 0;
    }
    char *out;
    size_t n;
    int complete;
    fuzz_constraint_walk(g, data, size, &out, &n, &complete);
    if (out && complete) {
        json_error_t je;
        /* \u0000 is valid JSON (a schema's pattern may ask for it); jansson refuses it unless told */
        json_t *j = json_loadb(out, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        FUZZ_CHECK(j, "output is not JSON (%s): %s", je.text, out);
        json_decref(j);
    }
    free(out);
    dsv4_grammar_free(g);
    return 0;
}
