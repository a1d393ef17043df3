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
        cmocka_unit_test(test_whole),       cmocka_unit_test(test_streamed), cmocka_unit_test(test_incremental_release),
        cmocka_unit_test(test_chat_mode_plain), cmocka_unit_test(test_malformed), cmocka_unit_test(test_truncated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
