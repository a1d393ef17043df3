/* The DSML parser (text/dsml.c) fed arbitrary model output incrementally. Input: one byte (bit 0: thinking
 * mode), then the output text. The text is parsed twice: in one piece, and in pieces of random sizes (1..64
 * bytes, drawn from a generator seeded by the input, so a run is reproducible). The piece boundaries must not
 * matter: same status, error, reasoning, content, calls and EOS flag; what the callbacks stream equals what the
 * accessors hold (each call's streamed argument pieces are its arguments, cut between UTF-8 characters); every call's arguments are a JSON object; a well-formed result has no control marker in its
 * reasoning or content (the official parser's safety check). */
#define _GNU_SOURCE /* memmem */
#include "fuzz.h"
#include "text/chat.h"
#include "text/dsml.h"
#include "text/strbuf.h"
#include <jansson.h>
#include <string.h>

typedef struct {
    dsv4_strbuf reasoning, content, args;   /* args: the pieces of the call being streamed */
    char *name;                             /* its announced name */
    int calls, begun, bad;
} sink;

static void on_reasoning(void *ud, const char *s, size_t n) { dsv4_sb_append(&((sink *)ud)->reasoning, s, n); }
static void on_content(void *ud, const char *s, size_t n) { dsv4_sb_append(&((sink *)ud)->content, s, n); }
/* A reported call is the one announced last, and its streamed pieces are its arguments. */
static void on_call(void *ud, const dsv4_tool_call *c) {
    sink *k = ud;
    if (k->begun != k->calls + 1 || !k->name || strcmp(k->name, c->name) || k->args.len != strlen(c->arguments) ||
        (k->args.len && memcmp(k->args.data, c->arguments, k->args.len)))
        k->bad++;
    k->calls++;
}
static void on_begin(void *ud, const char *name) {
    sink *k = ud;
    free(k->name);
    k->name = strdup(name);
    dsv4_sb_clear(&k->args);
    k->begun++;
}
/* Pieces are whole UTF-8 characters: none starts with a continuation byte. */
static void on_args(void *ud, const char *s, size_t n) {
    sink *k = ud;
    if (n && ((unsigned char)s[0] & 0xC0) == 0x80) k->bad++;
    dsv4_sb_append(&k->args, s, n);
}

/* Any control marker in s[0..n) (the list the parser's finish() checks). */
static int has_marker(const char *s, size_t n) {
    const char *const markers[5] = {DSV4_BOS_TEXT, DSV4_EOS_TEXT, DSV4_THINK_TEXT, DSV4_THINK_END_TEXT,
                                    "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"};
    for (int i = 0; i < 5; i++)
        if (memmem(s, n, markers[i], strlen(markers[i]))) return 1;
    return 0;
}

static int same(const char *a, size_t na, const char *b, size_t nb) { return na == nb && (!na || !memcmp(a, b, na)); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int thinking = data[0] & 1;
    const char *text = (const char *)data + 1;
    const size_t n = size - 1;
    sink sk = {0};
    dsv4_sb_init(&sk.reasoning);
    dsv4_sb_init(&sk.content);
    dsv4_sb_init(&sk.args);
    dsv4_dsml_callbacks cb = { on_reasoning, on_content, on_call, &sk, on_begin, on_args };
    dsv4_dsml_parser *whole = dsv4_dsml_new(thinking, NULL), *pieces = dsv4_dsml_new(thinking, &cb);
    FUZZ_CHECK(whole && pieces, "out of memory");
    dsv4_dsml_feed(whole, text, n);
    dsv4_dsml_status s1 = dsv4_dsml_finish(whole);
    fuzz_rng r;
    fuzz_rng_seed(&r, data, size);
    for (size_t off = 0; off < n;) {
        size_t k = 1 + fuzz_rng_next(&r) % 64;
        if (k > n - off) k = n - off;
        dsv4_dsml_feed(pieces, text + off, k);
        off += k;
    }
    dsv4_dsml_status s2 = dsv4_dsml_finish(pieces);

    FUZZ_CHECK(s1 == s2, "status %d in one piece, %d in pieces", s1, s2);
    FUZZ_CHECK(!strcmp(dsv4_dsml_error(whole), dsv4_dsml_error(pieces)), "errors differ: '%s' vs '%s'",
               dsv4_dsml_error(whole), dsv4_dsml_error(pieces));
    size_t a, b;
    const char *x = dsv4_dsml_raw(whole, &a), *y = dsv4_dsml_raw(pieces, &b);
    FUZZ_CHECK(same(x, a, text, n) && same(y, b, text, n), "raw text not kept");
    x = dsv4_dsml_reasoning(whole, &a);
    y = dsv4_dsml_reasoning(pieces, &b);
    FUZZ_CHECK(same(x, a, y, b), "reasoning differs (%zu vs %zu bytes)", a, b);
    FUZZ_CHECK(same(sk.reasoning.data, sk.reasoning.len, y, b), "streamed reasoning differs from the accessor");
    x = dsv4_dsml_content(whole, &a);
    y = dsv4_dsml_content(pieces, &b);
    FUZZ_CHECK(same(x, a, y, b), "content differs (%zu vs %zu bytes)", a, b);
    FUZZ_CHECK(same(sk.content.data, sk.content.len, y, b), "streamed content differs from the accessor");
    if (s1 == DSV4_DSML_OK) {
        /* the reasoning's length is read after the call that sets it (argument order is unspecified) */
        const char *reasoning_text = dsv4_dsml_reasoning(whole, &b);
        FUZZ_CHECK(!has_marker(x, a) && !has_marker(reasoning_text, b), "a control marker passed through in the reasoning or content");
    }
    FUZZ_CHECK(dsv4_dsml_saw_eos(whole) == dsv4_dsml_saw_eos(pieces), "EOS flag differs");
    const int nc = dsv4_dsml_n_calls(whole);
    FUZZ_CHECK(nc == dsv4_dsml_n_calls(pieces) && nc == sk.calls, "calls: %d vs %d (%d streamed)", nc,
               dsv4_dsml_n_calls(pieces), sk.calls);
    FUZZ_CHECK(!sk.bad, "streamed tool calls differ from the reported ones (%d)", sk.bad);
    FUZZ_CHECK(sk.begun >= nc && sk.begun <= nc + 1, "%d calls announced, %d reported", sk.begun, nc);
    for (int i = 0; i < nc; i++) {
        const dsv4_tool_call *c1 = dsv4_dsml_call(whole, i), *c2 = dsv4_dsml_call(pieces, i);
        FUZZ_CHECK(!strcmp(c1->name, c2->name) && !strcmp(c1->arguments, c2->arguments), "call %d differs", i);
        json_t *args = json_loads(c1->arguments, JSON_DECODE_ANY, NULL);
        FUZZ_CHECK(json_is_object(args), "call %d arguments are not a JSON object: %s", i, c1->arguments);
        json_decref(args);
    }
    dsv4_dsml_free(whole);
    dsv4_dsml_free(pieces);
    dsv4_sb_free(&sk.reasoning);
    dsv4_sb_free(&sk.content);
    dsv4_sb_free(&sk.args);
    free(sk.name);
    return 0;
}
