/* tokenizer.json (+ tokenizer_config.json) loading (text/tokenizer.c: dsv4_tokenizer_load_mem).
 * Input: tokenizer.json text, optionally followed by a NUL byte and the tokenizer_config.json text (JSON text
 * cannot contain a raw NUL, so the split is unambiguous). A tokenizer that loads must encode and decode. */
#include "fuzz.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include <stdlib.h>
#include <string.h>

/* Mixed scripts, digits, whitespace runs, a DeepSeek special-token name and invalid-for-BPE punctuation runs. */
static const char PROBE[] = "Hello, world! 12345 \xe4\xbd\xa0\xe5\xa5\xbd  \n\n\t<X><XY>"
                            "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>\xf0\x9f\x98\x80 it's";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t jlen = nul ? (size_t)(nul - data) : size;
    const char *cfg = nul ? (const char *)nul + 1 : NULL;
    size_t clen = nul ? size - jlen - 1 : 0;
    dsv4_tokenizer *t;
    dsv4_error err = {0};
    int rc = dsv4_tokenizer_load_mem((const char *)data, jlen, cfg, clen, &t, &err);
    if (rc) { fuzz_check_error(rc, &err); return 0; }
    FUZZ_CHECK(dsv4_tokenizer_vocab_size(t) > 0, "empty vocabulary loaded");
    for (int flags = 0; flags < 2; flags++) {
        int32_t *ids;
        size_t n_ids;
        rc = dsv4_tokenizer_encode(t, PROBE, sizeof PROBE - 1, flags ? DSV4_ENCODE_PLAIN : 0, &ids, &n_ids, &err);
        if (rc) { fuzz_check_error(rc, &err); continue; }
        for (size_t i = 0; i < n_ids; i++)
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < dsv4_tokenizer_vocab_size(t), "encode gave id %d", ids[i]);
        char *text;
        size_t len;
        rc = dsv4_tokenizer_decode(t, ids, n_ids, &text, &len, &err);
        if (rc) fuzz_check_error(rc, &err);
        else {
            FUZZ_CHECK(dsv4_utf8_valid_prefix(text, len) == len, "decode gave ill-formed UTF-8");
            free(text);
        }
        free(ids);
    }
    dsv4_tokenizer_free(t);
    return 0;
}
