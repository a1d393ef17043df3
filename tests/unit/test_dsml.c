/* DSML output parser: well-formed, nested JSON arguments, streamed in pieces of every size, malformed, truncated. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "text/dsml.h"
#include <stdlib.h>
#include <string.h>

#define D "\xef\xbd\x9c" "DSML" "\xef\xbd\x9c"
#define EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

static const char TWO_CALLS[] =
    "Let me check.</think>Checking now.\n\n<" D "tool_calls>\n"
    "<" D "invoke name=\"get_weather\">\n"
    "<" D "parameter name=\"location\" string=\"true\">Bei\"jing\n</" D "parameter>\n"
    "<" D "parameter name=\"opts\" string=\"false\">{\"units\": [\"c\", {\"deep\": [1, 2.5, null]}], \"n\": 3}</" D "parameter>\n"
    "</" D "invoke>\n"
    "<" D "invoke name=\"ping\">\n\n</" D "invoke>\n"
    "</" D "tool_calls>" EOS;

static void check_two_calls(dsv4_dsml_parser *p) {
    assert_int_equal(dsv4_dsml_status_of(p), DSV4_DSML_OK);
    assert_string_equal(dsv4_dsml_reasoning(p, NULL), "Let me check.");
    assert_string_equal(dsv4_dsml_content(p, NULL), "Checking now.");
    assert_int_equal(dsv4_dsml_n_calls(p), 2);
    assert_string_equal(dsv4_dsml_call(p, 0)->name, "get_weather");
    assert_string_equal(dsv4_dsml_call(p, 0)->arguments,
                        "{\"location\": \"Bei\\\"jing\\n\", \"opts\": {\"units\": [\"c\", {\"deep\": [1, 2.5, null]}], \"n\": 3}}");
    assert_string_equal(dsv4_dsml_call(p, 1)->name, "ping");
    assert_string_equal(dsv4_dsml_call(p, 1)->arguments, "{}");
    assert_true(dsv4_dsml_saw_eos(p));
}

static void test_whole(void **st) {
    (void)st;
    dsv4_dsml_parser *p = dsv4_dsml_new(1, NULL);
    dsv4_dsml_feed(p, TWO_CALLS, strlen(TWO_CALLS));
    assert_int_equal(dsv4_dsml_finish(p), DSV4_DSML_OK);
    check_two_calls(p);
    dsv4_dsml_free(p);
}

/* A JSON parameter value holding \u0000 is valid JSON: it stays in the arguments (jansson parses it only when told
 * JSON_ALLOW_NUL; without it the parser took the value for malformed). */
static void test_nul_escape_value(void **st) {
    (void)st;
    static const char CALL[] = "\n\n<" D "tool_calls>\n<" D "invoke name=\"f\">\n"
                               "<" D "parameter name=\"v\" string=\"false\">[\"a\\u0000b\"]</" D "parameter>\n"
                               "</" D "invoke>\n</" D "tool_calls>" EOS;
    dsv4_dsml_parser *p = dsv4_dsml_new(0, NULL);
    dsv4_dsml_feed(p, CALL, strlen(CALL));
    if (dsv4_dsml_finish(p) != DSV4_DSML_OK) fail_msg("%s", dsv4_dsml_error(p));
    assert_int_equal(dsv4_dsml_n_calls(p), 1);
    assert_string_equal(dsv4_dsml_call(p, 0)->arguments, "{\"v\": [\"a\\u0000b\"]}");
    dsv4_dsml_free(p);
}

typedef struct { char reasoning[256], content[256]; int calls; } seen;
static void on_r(void *ud, const char *s, size_t n) { strncat(((seen *)ud)->reasoning, s, n); }
static void on_c(void *ud, const char *s, size_t n) { strncat(((seen *)ud)->content, s, n); }
static void on_t(void *ud, const dsv4_tool_call *c) { (void)c; ((seen *)ud)->calls++; }

/* Every piece size from 1 byte (splitting UTF-8 and markers) up to 64. */
static void test_streamed(void **st) {
    (void)st;
    size_t n = strlen(TWO_CALLS);
    for (size_t piece = 1; piece <= 64; piece++) {
        seen s = {{0}, {0}, 0};
        dsv4_dsml_callbacks cb = {on_r, on_c, on_t, &s};
        dsv4_dsml_parser *p = dsv4_dsml_new(1, &cb);
        for (size_t i = 0; i < n; i += piece) {
            size_t k = n - i < piece ? n - i : piece;
            assert_int_equal(dsv4_dsml_feed(p, TWO_CALLS + i, k), DSV4_DSML_OK);
        }
        assert_int_equal(dsv4_dsml_finish(p), DSV4_DSML_OK);
        check_two_calls(p);
        assert_string_equal(s.reasoning, "Let me check.");
        assert_string_equal(s.content, "Checking now.");
        assert_int_equal(s.calls, 2);
        dsv4_dsml_free(p);
    }
}

/* Streamed tool calls: the name first, then argument pieces whose concatenation is each call's arguments, cut
 * between UTF-8 characters, for every piece size; a long string value goes out before its parameter closes. */
typedef struct {
    char names[4][32];
    char args[4][512];
    int n_begin, n_pieces, n_done, mismatch, bad_utf8;
    size_t args_at_last_feed;   /* bytes of arguments out for the current call */
} calls_seen;
static void on_begin(void *ud, const char *name) {
    calls_seen *c = ud;
    if (c->n_begin < 4) strcpy(c->names[c->n_begin], name);
    c->n_begin++;
}
static void on_args(void *ud, const char *s, size_t n) {
    calls_seen *c = ud;
    c->n_pieces++;
    /* whole characters only: no piece starts with a continuation byte or ends inside a character */
    if (n && (((unsigned char)s[0] & 0xC0) == 0x80)) c->bad_utf8++;
    if (c->n_begin >= 1 && c->n_begin <= 4) strncat(c->args[c->n_begin - 1], s, n);
}
static void on_done(void *ud, const dsv4_tool_call *call) {
    calls_seen *c = ud;
    if (c->n_done != c->n_begin - 1 || strcmp(c->names[c->n_done], call->name) || strcmp(c->args[c->n_done], call->arguments))
        c->mismatch++;
    c->n_done++;
}

static void test_streamed_arguments(void **st) {
    (void)st;
    /* a long string value with quotes, a newline, a "<" that is not the end tag and a 3-byte character */
    static const char LONG_CALL[] =
        "</think>\n\n<" D "tool_calls>\n<" D "invoke name=\"write_file\">\n"
        "<" D "parameter name=\"path\" string=\"true\">a.txt</" D "parameter>\n"
        "<" D "parameter name=\"text\" string=\"true\">line \"one\" <b>\nline two \xe2\x82\xac and more text here</" D "parameter>\n"
        "<" D "parameter name=\"n\" string=\"false\">[1, 2]</" D "parameter>\n"
        "</" D "invoke>\n</" D "tool_calls>";
    const char *const texts[2] = {TWO_CALLS, LONG_CALL};
    for (int t = 0; t < 2; t++) {
        const size_t n = strlen(texts[t]);
        for (size_t piece = 1; piece <= 64; piece++) {
            calls_seen c;
            memset(&c, 0, sizeof c);
            dsv4_dsml_callbacks cb = {NULL, NULL, on_done, &c, on_begin, on_args};
            dsv4_dsml_parser *p = dsv4_dsml_new(1, &cb);
            int value_before_close = 0;
            for (size_t i = 0; i < n; i += piece) {
                size_t k = n - i < piece ? n - i : piece;
                assert_int_equal(dsv4_dsml_feed(p, texts[t] + i, k), DSV4_DSML_OK);
                /* before the text parameter's end tag arrives, part of its value is out already */
                if (t == 1 && i + k < (size_t)(strstr(texts[t], "here</") - texts[t]) && strstr(c.args[0], "line two"))
                    value_before_close = 1;
            }
            assert_int_equal(dsv4_dsml_finish(p), DSV4_DSML_OK);
            const int nc = dsv4_dsml_n_calls(p);
            assert_int_equal(c.n_begin, nc);
            assert_int_equal(c.n_done, nc);
            assert_int_equal(c.mismatch, 0);
            assert_int_equal(c.bad_utf8, 0);
            for (int k = 0; k < nc; k++) assert_string_equal(c.args[k], dsv4_dsml_call(p, k)->arguments);
            if (t == 1) {
                assert_string_equal(c.args[0], "{\"path\": \"a.txt\", \"text\": \"line \\\"one\\\" <b>\\nline two \xe2\x82\xac and more text here\", \"n\": [1, 2]}");
                if (piece <= 8) {
                    assert_true(value_before_close);
                    assert_true(c.n_pieces > 6);   /* the value went out in several pieces */
                }
            }
            dsv4_dsml_free(p);
        }
    }
}

/* Reasoning is released before the end: a held tail is only what could start "</think>". */
static void test_incremental_release(void **st) {
    (void)st;
    seen s = {{0}, {0}, 0};
    dsv4_dsml_callbacks cb = {on_r, on_c, on_t, &s};
    dsv4_dsml_parser *p = dsv4_dsml_new(1, &cb);
    dsv4_dsml_feed(p, "thinking hard </th", 18);
    assert_string_equal(s.reasoning, "thinking hard ");
    dsv4_dsml_feed(p, "ink>Answer", 10);
    assert_string_equal(s.reasoning, "thinking hard ");
    assert_string_equal(s.content, "Answer");
    assert_int_equal(dsv4_dsml_finish(p), DSV4_DSML_OK);   /* EOS may be left out: the generator stops on it */
    assert_false(dsv4_dsml_saw_eos(p));
    dsv4_dsml_free(p);
}

static void test_chat_mode_plain(void **st) {
    (void)st;
    dsv4_dsml_parser *p = dsv4_dsml_new(0, NULL);
    const char *t = "Just text with a < and \n\n but no tags." EOS;
    dsv4_dsml_feed(p, t, strlen(t));
    assert_int_equal(dsv4_dsml_finish(p), DSV4_DSML_OK);
    assert_string_equal(dsv4_dsml_content(p, NULL), "Just text with a < and \n\n but no tags.");
    assert_int_equal(dsv4_dsml_n_calls(p), 0);
    dsv4_dsml_free(p);
}

static dsv4_dsml_status run(int thinking, const char *t, dsv4_dsml_parser **out) {
    dsv4_dsml_parser *p = dsv4_dsml_new(thinking, NULL);
    dsv4_dsml_feed(p, t, strlen(t));
    dsv4_dsml_status s = dsv4_dsml_finish(p);
    *out = p;
    return s;
}

static void expect(int thinking, const char *t, dsv4_dsml_status want) {
    dsv4_dsml_parser *p;
    dsv4_dsml_status got = run(thinking, t, &p);
    if (got != want) fail_msg("status %d, want %d (%s) for: %s", got, want, dsv4_dsml_error(p), t);
    if (want != DSV4_DSML_OK) {
        assert_true(strlen(dsv4_dsml_error(p)) > 0);
        size_t n;
        const char *raw = dsv4_dsml_raw(p, &n);
        assert_int_equal(n, strlen(t));
        assert_memory_equal(raw, t, n);   /* raw text preserved */
    }
    dsv4_dsml_free(p);
}

static void test_malformed(void **st) {
    (void)st;
    /* missing newline after the block tag */
    expect(0, "x\n\n<" D "tool_calls><" D "invoke name=\"a\">\n</" D "invoke>\n</" D "tool_calls>", DSV4_DSML_MALFORMED);
    /* bad invoke header */
    expect(0, "\n\n<" D "tool_calls>\n<" D "invoke nam=\"a\">\n</" D "invoke>\n</" D "tool_calls>", DSV4_DSML_MALFORMED);
    /* bad string attribute */
    expect(0, "\n\n<" D "tool_calls>\n<" D "invoke name=\"a\">\n<" D "parameter name=\"k\" string=\"yes\">v</" D
              "parameter>\n</" D "invoke>\n</" D "tool_calls>", DSV4_DSML_MALFORMED);
    /* duplicate parameter */
    expect(0, "\n\n<" D "tool_calls>\n<" D "invoke name=\"a\">\n<" D "parameter name=\"k\" string=\"true\">1</" D
              "parameter>\n<" D "parameter name=\"k\" string=\"true\">2</" D "parameter>\n</" D "invoke>\n</" D
              "tool_calls>", DSV4_DSML_MALFORMED);
    /* string="false" value that is not JSON */
    expect(0, "\n\n<" D "tool_calls>\n<" D "invoke name=\"a\">\n<" D "parameter name=\"k\" string=\"false\">{oops</" D
              "parameter>\n</" D "invoke>\n</" D "tool_calls>", DSV4_DSML_MALFORMED);
    /* text after the block */
    expect(0, "\n\n<" D "tool_calls>\n<" D "invoke name=\"a\">\n</" D "invoke>\n</" D "tool_calls>trailing", DSV4_DSML_MALFORMED);
    /* tool calls inside reasoning */
    expect(1, "thinking\n\n<" D "tool_calls>\n", DSV4_DSML_MALFORMED);
    /* text after EOS */
    expect(0, "done" EOS "more", DSV4_DSML_MALFORMED);
    /* special token inside content */
    expect(0, "a <think> b" EOS, DSV4_DSML_MALFORMED);
    expect(1, "r</think>a " D " b", DSV4_DSML_MALFORMED);
}

static void test_truncated(void **st) {
    (void)st;
    expect(1, "still thinking", DSV4_DSML_TRUNCATED);
    expect(0, "x\n\n<" D "tool_calls>\n<" D "invoke name=\"a\">\n<" D "parameter name=\"k\" string=\"true\">val", DSV4_DSML_TRUNCATED);
    expect(0, "x\n\n<" D "tool_calls>\n<" D "invoke name=\"a\">\n", DSV4_DSML_TRUNCATED);
    expect(0, "x\n\n<" D "tool_calls", DSV4_DSML_TRUNCATED);
    /* a complete block without EOS is fine */
    expect(0, "\n\n<" D "tool_calls>\n<" D "invoke name=\"a\">\n</" D "invoke>\n</" D "tool_calls>", DSV4_DSML_OK);
    /* reasoning truncated: what was seen is still reported */
    dsv4_dsml_parser *p;
    assert_int_equal(run(1, "partial reason", &p), DSV4_DSML_TRUNCATED);
    assert_string_equal(dsv4_dsml_reasoning(p, NULL), "partial reason");
    dsv4_dsml_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole),
        cmocka_unit_test(test_nul_escape_value),       cmocka_unit_test(test_streamed),    cmocka_unit_test(test_streamed_arguments), cmocka_unit_test(test_incremental_release),
        cmocka_unit_test(test_chat_mode_plain), cmocka_unit_test(test_malformed), cmocka_unit_test(test_truncated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
