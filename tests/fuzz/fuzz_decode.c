/* Decoding arbitrary ids (text/tokenizer.c: dsv4_tokenizer_decode and the streaming detokenizer) with the tiny
 * tokenizer (fixture, built once). Input: 16-bit little-endian words, each mapped to an id in
 * [-4, vocab + 4) so that in-range ids dominate and the edges are hit. Decoding succeeds exactly when every
 * id is in the vocabulary; the text is valid UTF-8 and equal to what the streaming decoder assembles. */
#include "fuzz.h"
#include "text/strbuf.h"
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
    const int32_t V = dsv4_tokenizer_vocab_size(tok);
    const size_t n = size / 2;
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!ids) return 0;
    int all_known = 1;
    for (size_t i = 0; i < n; i++) {
        ids[i] = (int32_t)((data[2 * i] | data[2 * i + 1] << 8) % (V + 8)) - 4;
        all_known &= dsv4_tokenizer_token_bytes(tok, ids[i], NULL) != NULL;
    }
    char *text;
    size_t len;
    dsv4_error err = {0};
    int rc = dsv4_tokenizer_decode(tok, ids, n, &text, &len, &err);
    if (rc) {
        fuzz_check_error(rc, &err);
        FUZZ_CHECK(!all_known && rc == DSV4_E_ARG, "known ids failed to decode: %s", err.msg);
        free(ids);
        return 0;
    }
    FUZZ_CHECK(all_known, "an unknown id was decoded");
    FUZZ_CHECK(strlen(text) <= len && dsv4_utf8_valid_prefix(text, len) == len, "decode gave ill-formed UTF-8");
    /* the streaming decoder, one id at a time */
    dsv4_detokenizer d;
    dsv4_detokenizer_init(&d, tok);
    dsv4_strbuf sb;
    dsv4_sb_init(&sb);
    for (size_t i = 0; i < n; i++) FUZZ_CHECK(dsv4_detokenizer_push(&d, ids[i], &sb, &err) == 0, "push: %s", err.msg);
    dsv4_detokenizer_finish(&d, &sb);
    FUZZ_CHECK(sb.len == len && (len == 0 || !memcmp(sb.data, text, len)), "streaming and one-shot decode differ");
    dsv4_sb_free(&sb);
    free(text);
    free(ids);
    return 0;
}
