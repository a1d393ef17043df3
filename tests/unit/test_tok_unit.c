/* Tokenizer building blocks without npm: UTF-8 assembler, byte map, BPE order and speed on a tiny hand-made
 * tokenizer (tests/data/text/tiny_tokenizer.json: 256 byte symbols, merges b+c, a+b, a+a, aa+aa, Ġ+a, Ã+©,
 * added tokens <X> and <XY>, DeepSeek's pre-tokenizer), load errors. Full-vocabulary exactness is checked
 * against @huggingface/tokenizers by tests/node/test_tokenizer.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "text/bytemap.h"
#include "text/tokenizer.h"
#include "text/utf8.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static dsv4_tokenizer *tiny(void) {
    const char *root = getenv("DSV4_ROOT");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/data/text/tiny_tokenizer.json", root ? root : ".");
    dsv4_tokenizer *t;
    dsv4_error err;
    if (dsv4_tokenizer_load(path, NULL, &t, &err)) fail_msg("%s", err.msg);
    return t;
}

static int32_t id_of(dsv4_tokenizer *t, const char *s) {
    int32_t id = dsv4_tokenizer_token_id(t, s);
    if (id < 0) fail_msg("no token %s", s);
    return id;
}

static size_t encode(dsv4_tokenizer *t, const char *s, size_t n, int32_t **ids) {
    size_t k;
    dsv4_error err;
    if (dsv4_tokenizer_encode(t, s, n, 0, ids, &k, &err)) fail_msg("%s", err.msg);
    return k;
}

static void test_bytemap(void **st) {
    (void)st;
    assert_int_equal(dsv4_byte_to_cp(' '), 0x120);
    assert_int_equal(dsv4_byte_to_cp('\n'), 0x10A);
    assert_int_equal(dsv4_byte_to_cp('\t'), 0x109);
    assert_int_equal(dsv4_byte_to_cp('A'), 'A');
    assert_int_equal(dsv4_byte_to_cp(0xAD), 0x143);
    for (int b = 0; b < 256; b++) assert_int_equal(dsv4_cp_to_byte(dsv4_byte_to_cp((unsigned char)b)), b);
    assert_int_equal(dsv4_cp_to_byte(0x144), -1);
}

static void push_str(dsv4_utf8_stream *s, const char *in, dsv4_strbuf *out) { dsv4_utf8_stream_push(s, in, strlen(in), out); }

static void test_utf8_stream(void **st) {
    (void)st;
    dsv4_utf8_stream s;
    dsv4_strbuf out;
    dsv4_sb_init(&out);
    dsv4_utf8_stream_init(&s);
    push_str(&s, "\xe4\xb8", &out);              /* first two bytes of 中: held */
    assert_int_equal(out.len, 0);
    push_str(&s, "\xad" "a", &out);
    assert_string_equal(out.data, "\xe4\xb8\xad" "a");
    dsv4_sb_clear(&out);
    push_str(&s, "\xff", &out);                   /* never valid */
    push_str(&s, "\xe4\xb8" "b", &out);           /* truncated character, then ASCII */
    push_str(&s, "\xc0\xaf", &out);               /* overlong: two replacements */
    push_str(&s, "\xed\xa0\x80", &out);           /* surrogate: three replacements (maximal subparts) */
    push_str(&s, "\xf0\x9f\x98", &out);           /* held at the end... */
    dsv4_utf8_stream_flush(&s, &out);             /* ...and replaced by flush */
    assert_string_equal(out.data, "\xef\xbf\xbd" "\xef\xbf\xbd" "b" "\xef\xbf\xbd\xef\xbf\xbd"
                                  "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "\xef\xbf\xbd");
    assert_int_equal(dsv4_utf8_valid_prefix("ok\xe4\xb8", 5), 2);
    dsv4_sb_free(&out);
}

static void test_bpe_order(void **st) {
    (void)st;
    dsv4_tokenizer *t = tiny();
    int32_t *ids;
    /* rank(b c) < rank(a b): "abc" -> a + bc, not ab + c */
    size_t k = encode(t, "abc", 3, &ids);
    assert_int_equal(k, 2);
    assert_int_equal(ids[0], 'a');
    assert_int_equal(ids[1], id_of(t, "bc"));
    free(ids);
    /* equal ranks merge leftmost first: aaaaa -> aa aa a -> aaaa a */
    k = encode(t, "aaaaa", 5, &ids);
    assert_int_equal(k, 2);
    assert_int_equal(ids[0], id_of(t, "aaaa"));
    assert_int_equal(ids[1], 'a');
    free(ids);
    /* " a" merges (Ġ a); a byte-level pair across a 2-byte character: é = C3 A9 -> Ã© */
    k = encode(t, " a\xc3\xa9", 4, &ids);
    assert_int_equal(k, 2);
    assert_int_equal(ids[0], id_of(t, "\xc4\xa0" "a"));
    assert_int_equal(ids[1], id_of(t, "\xc3\x83\xc2\xa9"));
    free(ids);
    dsv4_tokenizer_free(t);
}

static void test_added_tokens(void **st) {
    (void)st;
    dsv4_tokenizer *t = tiny();
    int32_t *ids;
    int32_t x = id_of(t, "<X>"), xy = id_of(t, "<XY>");
    size_t k = encode(t, "b<XY>c<X>", 9, &ids);   /* longest match wins */
    assert_int_equal(k, 4);
    assert_int_equal(ids[0], 'b');
    assert_int_equal(ids[1], xy);
    assert_int_equal(ids[2], 'c');
    assert_int_equal(ids[3], x);
    free(ids);
    size_t n;
    dsv4_error err;
    assert_int_equal(dsv4_tokenizer_encode(t, "<X>", 3, DSV4_ENCODE_PLAIN, &ids, &n, &err), 0);
    assert_int_equal(n, 3);   /* plain: "<", "X", ">" */
    free(ids);
    /* empty input: no ids, non-NULL array */
    assert_int_equal(dsv4_tokenizer_encode(t, "", 0, 0, &ids, &n, &err), 0);
    assert_int_equal(n, 0);
    assert_non_null(ids);
    free(ids);
    /* ill-formed UTF-8 is an argument error, not a crash */
    assert_int_equal(dsv4_tokenizer_encode(t, "a\xff", 2, 0, &ids, &n, &err), DSV4_E_ARG);
    dsv4_tokenizer_free(t);
}

static void test_decode(void **st) {
    (void)st;
    dsv4_tokenizer *t = tiny();
    const char *text = "x<X>y \xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\n\tabc";
    int32_t *ids;
    size_t k = encode(t, text, strlen(text), &ids);
    char *back;
    size_t len;
    dsv4_error err;
    assert_int_equal(dsv4_tokenizer_decode(t, ids, k, &back, &len, &err), 0);
    assert_string_equal(back, text);
    free(back);
    /* streaming: the 4-byte emoji arrives as byte tokens and appears only with its last byte */
    dsv4_detokenizer d;
    dsv4_detokenizer_init(&d, t);
    dsv4_strbuf out;
    dsv4_sb_init(&out);
    int32_t bytes[4], *one;
    assert_int_equal(encode(t, "\xf0\x9f\x98\x80", 4, &one), 4);   /* no merges apply: 4 byte tokens */
    memcpy(bytes, one, sizeof bytes);
    free(one);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dsv4_detokenizer_push(&d, bytes[i], &out, &err), 0);
        assert_int_equal(out.len, 0);
    }
    assert_int_equal(dsv4_detokenizer_push(&d, bytes[3], &out, &err), 0);
    assert_string_equal(out.data, "\xf0\x9f\x98\x80");
    /* a dangling lead byte becomes U+FFFD at the end */
    dsv4_sb_clear(&out);
    dsv4_detokenizer_push(&d, bytes[0], &out, &err);
    dsv4_detokenizer_finish(&d, &out);
    assert_string_equal(out.data, "\xef\xbf\xbd");
    assert_int_equal(dsv4_detokenizer_push(&d, 1 << 20, &out, &err), DSV4_E_ARG);
    assert_int_equal(dsv4_detokenizer_push(&d, -1, &out, &err), DSV4_E_ARG);
    dsv4_sb_free(&out);
    free(ids);
    dsv4_tokenizer_free(t);
}

/* One 1 MiB piece (letters), a 1 MiB digit run and 1 MiB of one CJK character must stay near-linear. */
static void test_long_inputs(void **st) {
    (void)st;
    dsv4_tokenizer *t = tiny();
    size_t n = 1 << 20;
    char *buf = malloc(n * 3);
    const char *fill[3] = {"a", "7", "\xe4\xb8\xad"};
    for (int f = 0; f < 3; f++) {
        size_t l = strlen(fill[f]), len = 0;
        while (len + l <= n) { memcpy(buf + len, fill[f], l); len += l; }
        clock_t c0 = clock();
        int32_t *ids;
        size_t k = encode(t, buf, len, &ids);
        double dt = (double)(clock() - c0) / CLOCKS_PER_SEC;
        if (dt > 5) fail_msg("%s x %zu took %.2fs", fill[f], len / l, dt);
        if (f == 0) assert_int_equal(k, len / 4);   /* all "aaaa" */
        if (f == 1) assert_int_equal(k, len);       /* digits isolated in 3s, no merges in the tiny vocab */
        free(ids);
    }
    free(buf);
    dsv4_tokenizer_free(t);
}

static void test_load_errors(void **st) {
    (void)st;
    dsv4_tokenizer *t;
    dsv4_error err;
    assert_int_equal(dsv4_tokenizer_load("/nonexistent/tokenizer.json", NULL, &t, &err), DSV4_E_IO);
    assert_null(t);
    char path[] = "/tmp/dsv4_tok_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", f);
    fclose(f);
    /* no byte-level symbols in the vocab: a clear format error */
    assert_int_equal(dsv4_tokenizer_load(path, NULL, &t, &err), DSV4_E_FORMAT);
    assert_non_null(strstr(err.msg, "byte"));
    f = fopen(path, "w");
    fputs("{\"model\": ", f);
    fclose(f);
    assert_int_equal(dsv4_tokenizer_load(path, NULL, &t, &err), DSV4_E_FORMAT);
    remove(path);
}

static void test_bench_corpus(void **st) {
    (void)st;
    size_t n;
    char *c = dsv4_tokenizer_bench_corpus(100000, &n);
    assert_true(n >= 99000 && n <= 100000 + 256);   /* whole lines: may pass the target by one */
    assert_int_equal(dsv4_utf8_valid_prefix(c, n), n);
    dsv4_tokenizer *t = tiny();
    dsv4_error err;
    assert_true(dsv4_tokenizer_bench_mbps(t, c, n, 1, &err) > 0);
    dsv4_tokenizer_free(t);
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytemap), cmocka_unit_test(test_utf8_stream), cmocka_unit_test(test_bpe_order),
        cmocka_unit_test(test_added_tokens), cmocka_unit_test(test_decode), cmocka_unit_test(test_long_inputs),
        cmocka_unit_test(test_load_errors), cmocka_unit_test(test_bench_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
