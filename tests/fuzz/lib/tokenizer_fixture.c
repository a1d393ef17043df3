/* The tokenizer the encode / decode targets share: tests/data/text/tiny_tokenizer.json (the real DeepSeek
 * pre-tokenizer regexes, the byte alphabet, six merges and two added tokens, one a prefix of the other), with
 * more merges added here so that BPE has real work: every pair of lowercase letters, a space before each letter,
 * and a few merges of merges ("the", "ing", " the", "tion"), ranked after the file's own. Found from the working
 * directory (the repository root, where make and the test runner work) or $DSV4_ROOT. */
#include "../fuzz.h"
#include "text/tokenizer.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPACE "\xc4\xa0"   /* the byte-level symbol of ' ' (U+0120) */

/* vocab[a + b] = next id, merges += "a b" (skipped when the result is there already) */
static void add_merge(json_t *vocab, json_t *merges, const char *a, const char *b, json_int_t *next) {
    char ab[64], line[64];
    snprintf(ab, sizeof ab, "%s%s", a, b);
    snprintf(line, sizeof line, "%s %s", a, b);
    if (json_object_get(vocab, ab)) return;
    json_object_set_new(vocab, ab, json_integer((*next)++));
    json_array_append_new(merges, json_string(line));
}

dsv4_tokenizer *fuzz_tiny_tokenizer(void) {
    static const char rel[] = "tests/data/text/tiny_tokenizer.json";
    char path[4200];
    const char *root = getenv("DSV4_ROOT");
    snprintf(path, sizeof path, "%s/%s", root && *root ? root : ".", rel);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        fprintf(stderr, "fuzz: fixture tokenizer %s: %s (run from the repository root or set DSV4_ROOT)\n", path, je.text);
        abort();
    }
    json_t *model = json_object_get(j, "model"), *vocab = json_object_get(model, "vocab"),
           *merges = json_object_get(model, "merges");
    json_int_t next = 264;   /* after the vocabulary (0..261) and the added tokens (262, 263) */
    char a[2] = {0}, b[2] = {0};
    for (char x = 'a'; x <= 'z'; x++) {
        a[0] = x;
        for (char y = 'a'; y <= 'z'; y++) { b[0] = y; add_merge(vocab, merges, a, b, &next); }
        add_merge(vocab, merges, SPACE, a, &next);
    }
    add_merge(vocab, merges, "th", "e", &next);
    add_merge(vocab, merges, "in", "g", &next);
    add_merge(vocab, merges, SPACE "t", "he", &next);
    add_merge(vocab, merges, "ti", "on", &next);
    /* the added tokens' ids move past the new vocabulary (an id may not be both) */
    size_t i;
    json_t *tok;
    json_array_foreach(json_object_get(j, "added_tokens"), i, tok) json_object_set_new(tok, "id", json_integer(next++));
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    dsv4_tokenizer *t;
    dsv4_error err;
    if (!text || dsv4_tokenizer_load_mem(text, strlen(text), NULL, 0, &t, &err)) {
        fprintf(stderr, "fuzz: fixture tokenizer: %s\n", text ? err.msg : "out of memory");
        abort();
    }
    free(text);
    return t;
}
