/* The tokenizer the encode / decode targets share: tests/data/text/tiny_tokenizer.json (the real DeepSeek
 * pre-tokenizer regexes, the byte alphabet, a few merges and two added tokens, one a prefix of the other). Found
 * from the working directory (the repository root, where make and the test runner work) or $DSV4_ROOT. */
#include "../fuzz.h"
#include "text/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

dsv4_tokenizer *fuzz_tiny_tokenizer(void) {
    static const char rel[] = "tests/data/text/tiny_tokenizer.json";
    char path[4200];
    const char *root = getenv("DSV4_ROOT");
    snprintf(path, sizeof path, "%s/%s", root && *root ? root : ".", rel);
    dsv4_tokenizer *t;
    dsv4_error err;
    if (dsv4_tokenizer_load(path, NULL, &t, &err)) {
        fprintf(stderr, "fuzz: fixture tokenizer: %s (run from the repository root or set DSV4_ROOT)\n", err.msg);
        abort();
    }
    return t;
}
