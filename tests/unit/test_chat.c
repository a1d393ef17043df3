/* V4 chat encoding: the spec's worked examples (TOKENIZER_AND_CHAT.md 2.3) and one case per rule.
 * The four official cases are checked byte for byte by tests/node/test_render.sh through `dsv4 render`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "text/chat.h"
#include "text/pyjson.h"
#include <stdlib.h>
#include <string.h>

#define FW "\xef\xbd\x9c"
#define BOS "<" FW "begin\xe2\x96\x81of\xe2\x96\x81sentence" FW ">"
#define EOS "<" FW "end\xe2\x96\x81of\xe2\x96\x81sentence" FW ">"
#define USER "<" FW "User" FW ">"
#define ASSIST "<" FW "Assistant" FW ">"
#define D FW "DSML" FW
#define EFFORT_ABS "Reasoning Effort: Absolute maximum with no shortcuts permitted.\nYou MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\nExplicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
#define TOOLS_START "\n\n## Tools\n\nYou have access to a set of tools"
#define TOOLS_END "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"

static char *render(const char *json, int *rc) {
    json_error_t je;
    json_t *req = json_loads(json, 0, &je);
    if (!req) fail_msg("bad test JSON: %s: %s", je.text, json);
    char *out = NULL;
    size_t len;
    dsv4_error err;
    *rc = dsv4_chat_render_request(req, &out, &len, &err);
    json_decref(req);
    return out;
}

static void expect(const char *json, const char *want) {
    int rc;
    char *got = render(json, &rc);
    assert_int_equal(rc, 0);
    if (strcmp(got, want)) fail_msg("render mismatch\n want: %s\n got:  %s", want, got);
    free(got);
}

static void expect_error(const char *json) {
    int rc;
    char *got = render(json, &rc);
    assert_int_not_equal(rc, 0);
    assert_null(got);
}

#define SYS_USER(mode) "{\"mode\": \"" mode "\", \"messages\": [{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"}, {\"role\": \"user\", \"content\": \"What is 2+2?\"}]}"

static void test_one_turn(void **st) {
    (void)st;
    expect(SYS_USER("chat"), BOS "You are a helpful assistant." USER "What is 2+2?" ASSIST "</think>");
    expect(SYS_USER("thinking"), BOS "You are a helpful assistant." USER "What is 2+2?" ASSIST "<think>");
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}]}", BOS USER "hello" ASSIST "</think>");
}

#define TWO_TURNS(extra) "{\"mode\": \"thinking\", \"messages\": [{\"role\": \"system\", \"content\": \"S\"" extra "}, " \
    "{\"role\": \"user\", \"content\": \"One\"}, {\"role\": \"assistant\", \"reasoning_content\": \"First reasoning.\", " \
    "\"content\": \"First answer.\"}, {\"role\": \"user\", \"content\": \"Two\"}]}"

static void test_drop_thinking(void **st) {
    (void)st;
    expect(TWO_TURNS(""), BOS "S" USER "One" ASSIST "</think>First answer." EOS USER "Two" ASSIST "<think>");
    /* chat mode never renders reasoning */
    expect("{\"mode\": \"chat\", \"messages\": [{\"role\": \"user\", \"content\": \"One\"}, {\"role\": \"assistant\", "
           "\"reasoning_content\": \"R\", \"content\": \"A\"}, {\"role\": \"user\", \"content\": \"Two\"}]}",
           BOS USER "One" ASSIST "</think>A" EOS USER "Two" ASSIST "</think>");
    /* drop_thinking=false keeps it */
    expect("{\"mode\": \"thinking\", \"drop_thinking\": false, \"messages\": [{\"role\": \"user\", \"content\": \"One\"}, "
           "{\"role\": \"assistant\", \"reasoning_content\": \"R\", \"content\": \"A\"}, {\"role\": \"user\", \"content\": \"Two\"}]}",
           BOS USER "One" ASSIST "<think>R</think>A" EOS USER "Two" ASSIST "<think>");
    /* a developer message before the last user message disappears in thinking mode */
    expect("{\"mode\": \"thinking\", \"messages\": [{\"role\": \"developer\", \"content\": \"Dev\"}, {\"role\": \"assistant\", "
           "\"content\": \"A\"}, {\"role\": \"user\", \"content\": \"U\"}]}",
           BOS "A" EOS USER "U" ASSIST "<think>");
    /* assistant after the last user keeps its reasoning (official golden #2 pattern) */
    expect("{\"mode\": \"thinking\", \"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", "
           "\"reasoning_content\": \"R\", \"content\": \"A\"}]}",
           BOS USER "Q" ASSIST "<think>R</think>A" EOS);
}

static void test_tools_keep_reasoning(void **st) {
    (void)st;
    int rc;
    char *got = render(TWO_TURNS(", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}]"), &rc);
    assert_int_equal(rc, 0);
    const char *tail = TOOLS_END USER "One" ASSIST "<think>First reasoning.</think>First answer." EOS USER "Two" ASSIST "<think>";
    assert_non_null(strstr(got, BOS "S" TOOLS_START));
    assert_non_null(strstr(got, "### Available Tool Schemas\n\n{\"name\": \"f\", \"parameters\": {}}\n\n"));
    assert_string_equal(got + strlen(got) - strlen(tail), tail);
    free(got);
    /* top-level tools: attached to a new empty system message */
    got = render("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"messages\": [{\"role\": \"user\", \"content\": \"Q\"}]}", &rc);
    assert_int_equal(rc, 0);
    assert_memory_equal(got, BOS TOOLS_START, strlen(BOS TOOLS_START));
    free(got);
}

#define CALLS_AB "{\"role\": \"assistant\", \"tool_calls\": [" \
    "{\"id\": \"a\", \"type\": \"function\", \"function\": {\"name\": \"fa\", \"arguments\": \"{}\"}}, " \
    "{\"id\": \"b\", \"type\": \"function\", \"function\": {\"name\": \"fb\", \"arguments\": \"{}\"}}]}"

static void test_tool_results_sorted_and_merged(void **st) {
    (void)st;
    expect("{\"mode\": \"thinking\", \"messages\": [{\"role\": \"user\", \"content\": \"Go\"}, " CALLS_AB ", "
           "{\"role\": \"tool\", \"tool_call_id\": \"b\", \"content\": \"B result\"}, "
           "{\"role\": \"tool\", \"tool_call_id\": \"a\", \"content\": \"A result\"}, "
           "{\"role\": \"user\", \"content\": \"And now this.\"}]}",
           BOS USER "Go" ASSIST "</think>\n\n<" D "tool_calls>\n<" D "invoke name=\"fa\">\n\n</" D "invoke>\n<" D
           "invoke name=\"fb\">\n\n</" D "invoke>\n</" D "tool_calls>" EOS USER "<tool_result>A result</tool_result>\n\n"
           "<tool_result>B result</tool_result>\n\nAnd now this." ASSIST "<think>");
}

static void test_argument_formatting(void **st) {
    (void)st;
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
           "[{\"function\": {\"name\": \"t\", \"arguments\": \"{\\\"count\\\": 7, \\\"list\\\": [1, \\\"two\\\"], "
           "\\\"nothing\\\": null, \\\"s\\\": \\\"x\\\\ny\\\", \\\"f\\\": 2.50, \\\"big\\\": 1e16, \\\"o\\\": {\\\"k\\\":true}}\"}}]}]}",
           BOS USER "Q" ASSIST "</think>\n\n<" D "tool_calls>\n<" D "invoke name=\"t\">\n"
           "<" D "parameter name=\"count\" string=\"false\">7</" D "parameter>\n"
           "<" D "parameter name=\"list\" string=\"false\">[1, \"two\"]</" D "parameter>\n"
           "<" D "parameter name=\"nothing\" string=\"false\">null</" D "parameter>\n"
           "<" D "parameter name=\"s\" string=\"true\">x\ny</" D "parameter>\n"
           "<" D "parameter name=\"f\" string=\"false\">2.5</" D "parameter>\n"
           "<" D "parameter name=\"big\" string=\"false\">1e+16</" D "parameter>\n"
           "<" D "parameter name=\"o\" string=\"false\">{\"k\": true}</" D "parameter>\n"
           "</" D "invoke>\n</" D "tool_calls>" EOS);
    /* arguments that are not JSON become one string parameter named "arguments" */
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"tool_calls\": "
           "[{\"function\": {\"name\": \"t\", \"arguments\": \"not json\"}}]}]}",
           BOS USER "Q" ASSIST "</think>\n\n<" D "tool_calls>\n<" D "invoke name=\"t\">\n<" D
           "parameter name=\"arguments\" string=\"true\">not json</" D "parameter>\n</" D "invoke>\n</" D "tool_calls>" EOS);
}

static void test_effort(void **st) {
    (void)st;
    const char *tail = USER "solve it" ASSIST "<think>";
    char want[2048];
    snprintf(want, sizeof want, "%s%s%s", BOS, EFFORT_ABS, tail);
    expect("{\"mode\": \"thinking\", \"effort\": \"max\", \"messages\": [{\"role\": \"user\", \"content\": \"solve it\"}]}", want);
    expect("{\"mode\": \"thinking\", \"effort\": \"high\", \"encoder\": \"v4-0731\", \"messages\": [{\"role\": \"user\", \"content\": \"solve it\"}]}", want);
    expect("{\"mode\": \"thinking\", \"effort\": \"high\", \"messages\": [{\"role\": \"user\", \"content\": \"solve it\"}]}", BOS USER "solve it" ASSIST "<think>");
    expect("{\"mode\": \"thinking\", \"effort\": \"low\", \"encoder\": \"v4-0731\", \"messages\": [{\"role\": \"user\", \"content\": \"solve it\"}]}", BOS USER "solve it" ASSIST "<think>");
    expect("{\"mode\": \"chat\", \"effort\": \"max\", \"messages\": [{\"role\": \"user\", \"content\": \"solve it\"}]}", BOS USER "solve it" ASSIST "</think>");
    int rc;
    char *got = render("{\"mode\": \"thinking\", \"effort\": \"max\", \"encoder\": \"v4-0731\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", &rc);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(got, BOS "Reasoning Effort: Beyond maximum \xe2\x80\x94 exhaustive"));
    assert_non_null(strstr(got, "no error remains undiscovered.\n\n" USER "x"));
    free(got);
    expect_error("{\"mode\": \"thinking\", \"effort\": \"low\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}");
    expect_error("{\"mode\": \"thinking\", \"effort\": \"none\", \"encoder\": \"v4-0731\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}");
}

static void test_response_format_reminder_task(void **st) {
    (void)st;
    expect("{\"messages\": [{\"role\": \"system\", \"content\": \"S\", \"response_format\": {\"type\": \"json_object\", \"path\": \"a/b\"}}, "
           "{\"role\": \"user\", \"content\": \"Q\"}]}",
           BOS "S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
           "{\"type\": \"json_object\", \"path\": \"a/b\"}" USER "Q" ASSIST "</think>");
    expect("{\"mode\": \"thinking\", \"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"latest_reminder\", \"content\": \"2026-07-31\"}, "
           "{\"role\": \"user\", \"content\": \"Which day?\", \"task\": \"action\"}]}",
           BOS "S<" FW "latest_reminder" FW ">2026-07-31" USER "Which day?" ASSIST "<think><" FW "action" FW ">");
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"Q\", \"task\": \"query\"}]}", BOS USER "Q<" FW "query" FW ">");
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"A\", \"task\": \"title\"}]}",
           BOS USER "Q" ASSIST "</think>A" EOS "<" FW "title" FW ">");
    /* wo_eos: a continued assistant prefix */
    expect("{\"messages\": [{\"role\": \"user\", \"content\": \"Q\"}, {\"role\": \"assistant\", \"content\": \"Partial\", \"wo_eos\": true}]}",
           BOS USER "Q" ASSIST "</think>Partial");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": \"Q\", \"task\": \"bogus\"}]}");
}

static void test_errors(void **st) {
    (void)st;
    expect_error("{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}");
    expect_error("{\"messages\": [{\"role\": \"developer\"}]}");
    expect_error("{\"messages\": [{\"role\": \"user\", \"content\": [1]}]}");
    expect_error("{\"messages\": 3}");
    expect_error("{\"mode\": \"fast\", \"messages\": []}");
}

static void test_python_floats(void **st) {
    (void)st;
    const struct { double v; const char *s; } cases[] = {
        {1.0, "1.0"}, {0.1, "0.1"}, {2.5, "2.5"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"}, {1e-5, "1e-05"},
        {0.0001, "0.0001"}, {-0.0, "-0.0"}, {123456.789, "123456.789"}, {1.7976931348623157e308, "1.7976931348623157e+308"},
        {5e-324, "5e-324"}, {0.30000000000000004, "0.30000000000000004"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsv4_strbuf b;
        dsv4_sb_init(&b);
        dsv4_pyjson_float(&b, cases[i].v);
        assert_string_equal(b.data, cases[i].s);
        dsv4_sb_free(&b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_turn), cmocka_unit_test(test_drop_thinking), cmocka_unit_test(test_tools_keep_reasoning),
        cmocka_unit_test(test_tool_results_sorted_and_merged), cmocka_unit_test(test_argument_formatting),
        cmocka_unit_test(test_effort), cmocka_unit_test(test_response_format_reminder_task), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_python_floats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
