/* Encoding arbitrary bytes (text/tokenizer.c: dsv4_tokenizer_encode) with the tiny tokenizer (fixture, built
 * once). Input: one flags byte (bit 0: DSV4_ENCODE_PLAIN, bit 1: DSV4_ENCODE_ADD_BOS), then the text.
 * Valid UTF-8 must encode, and decoding must give the text back (byte-level BPE loses nothing; added tokens
 * decode to their content); anything else must fail with DSV4_E_ARG. */
#include "fuzz.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include <stdlib.h>
#include <string.h>

static dsv4_tokenizer *tok;

static void free_tok(void) { dsv4_tokenizer_free(tok); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    tok = fuzz_tiny_tokenizer();
    atexit(free_tok);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int flags = (data[0] & 1 ? DSV4_ENCODE_PLAIN : 0) | (data[0] & 2 ? DSV4_ENCODE_ADD_BOS : 0);
    const char *text = (const char *)data + 1;
    const size_t n = size - 1;
    int32_t *ids;
    size_t n_ids;
    dsv4_error err = {0};
    int rc = dsv4_tokenizer_encode(tok, text, n, flags, &ids, &n_ids, &err);
    /* the two input errors: ill-formed UTF-8, and asking for a BOS the tokenizer lacks (the tiny one has none) */
    const int valid = dsv4_utf8_valid_prefix(text, n) == n;
    const int bos_ok = !(flags & DSV4_ENCODE_ADD_BOS) || dsv4_tokenizer_bos_id(tok) >= 0;
    if (rc) {
        fuzz_check_error(rc, &err);
        FUZZ_CHECK((!valid || !bos_ok) && rc == DSV4_E_ARG, "valid text failed to encode: %s", err.msg);
        return 0;
    }
    FUZZ_CHECK(valid && bos_ok, "ill-formed UTF-8 was encoded, or a missing BOS added");
    size_t skip = 0;
    if (flags & DSV4_ENCODE_ADD_BOS) {
        FUZZ_CHECK(n_ids >= 1 && ids[0] == dsv4_tokenizer_bos_id(tok), "no BOS first");
        skip = 1;
    }
    for (size_t i = 0; i < n_ids; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < dsv4_tokenizer_vocab_size(tok), "id %d out of range", ids[i]);
    char *back;
    size_t len;
    rc = dsv4_tokenizer_decode(tok, ids + skip, n_ids - skip, &back, &len, &err);
    FUZZ_CHECK(rc == 0, "decode of encoded ids failed: %s", err.msg);
    FUZZ_CHECK(len == n && !memcmp(back, text, n), "round trip changed the text (%zu -> %zu bytes)", n, len);
    free(back);
    free(ids);
    return 0;
}
