/* The DSML tool-call grammar (engine/tool_grammar.h): random walks under the constraint, at temperature "any
 * allowed token uniformly", on a vocabulary with the DSML marker and </think> as special tokens; every output
 * that ends with EOS is parsed back by the DSML parser (text/dsml.c, independent of the grammar) into tool calls
 * whose arguments validate against the tool's schema (tests/unit/helpers/mini_validator.c, independent of the
 * schema compiler): required = one or more calls, named = exactly one call to that tool, auto = text or calls.
 * Plus: the exact reply the chat template writes is accepted; errors name the tool. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "engine/constraint.h"
#include "engine/tool_grammar.h"
#include "text/chat.h"
#include "text/dsml.h"
#include "helpers/mini_validator.h"

enum { EOS = 256, DSML = 257, THINK_END = 258 };
static const char *const MULTI[] = { "<", "</", "invoke", " name=\"", "\">\n", "parameter", " string=\"false\">",
                                     " string=\"true\">", "tool_calls>", "\n\n", "get_weather", "location", "unit",
                                     "\"celsius\"", "\"", "12", "true", "null", "Paris", NULL };

static dsv4_cvocab *make_vocab(void) {
    const char *bytes[400] = {0};
    size_t lens[400] = {0};
    static char single[256];
    for (int i = 0; i < 256; i++) { single[i] = (char)i; bytes[i] = &single[i]; lens[i] = 1; }
    int n = 259;
    for (int i = 0; MULTI[i]; i++, n++) { bytes[n] = MULTI[i]; lens[n] = strlen(MULTI[i]); }
    dsv4_cvocab *v;
    dsv4_error err;
    if (dsv4_cvocab_new(bytes, lens, n, EOS, &v, &err)) fail_msg("vocab: %s", err.msg);
    if (dsv4_cvocab_add_special(v, DSV4_DSML_TEXT, strlen(DSV4_DSML_TEXT), DSML, &err) ||
        dsv4_cvocab_add_special(v, DSV4_THINK_END_TEXT, strlen(DSV4_THINK_END_TEXT), THINK_END, &err))
        fail_msg("special: %s", err.msg);
    return v;
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"strict\":true,\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"location\":{\"type\":\"string\",\"description\":\"city\"},\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7}},\"required\":[\"location\",\"unit\"],\"additionalProperties\":false}}},"
    " {\"type\":\"function\",\"function\":{\"name\":\"ping\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}},"
    " {\"type\":\"function\",\"function\":{\"name\":\"tag\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"items\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"},\"maxItems\":3}},\"required\":[\"items\"],"
    "\"$defs\":{\"t\":{\"type\":\"string\",\"pattern\":\"^[a-z]{1,4}$\"}}}}}]";

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17;
    return *x;
}

static const json_t *tool_fn(const json_t *tools, const char *name) {
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        if (!strcmp(json_string_value(json_object_get(fn, "name")), name)) return fn;
    }
    return NULL;
}

/* One random walk; returns the number of calls parsed (-1: ended by the length bound). */
static int walk(const dsv4_grammar *g, const dsv4_cvocab *v, const json_t *tools, int thinking, uint64_t seed,
                int64_t max_bytes, const char *only, int start_block) {
    dsv4_error err;
    dsv4_cstate *s;
    assert_int_equal(dsv4_cstate_new(g, v, max_bytes, &s, &err), 0);
    const int V = dsv4_cvocab_size(v);
    uint64_t *bits = malloc(sizeof *bits * (size_t)((V + 63) / 64));
    int32_t *allowed = malloc(sizeof *allowed * (size_t)V);
    char *text = malloc(1 << 16);
    size_t n = 0;
    uint64_t rng = seed * 2654435761u + 1;
    int complete = 0;
    /* auto mode: text, then the start of a block (uniform random text almost never writes it) */
    const int32_t opening[] = { 'h', 'i', '\n', '\n', '<', DSML };
    for (int step = 0; !dsv4_cstate_finished(s); step++) {
        assert_int_equal(dsv4_cstate_allowed(s, bits, &err), 0);
        int k = 0;
        for (int32_t id = 0; id < V; id++)
            if ((bits[id >> 6] >> (id & 63)) & 1) allowed[k++] = id;
        assert_true(k > 0);
        int32_t tok = allowed[rng_next(&rng) % (uint64_t)k];
        if (start_block && step < 6) {
            tok = opening[step];
            assert_true(dsv4_cstate_allows(s, tok));
        }
        if (tok == EOS) complete = dsv4_cstate_complete(s);
        assert_int_equal(dsv4_cstate_advance(s, tok, &err), 0);
        if (tok == EOS) break;
        size_t len;
        const char *b = dsv4_cvocab_bytes(v, tok, &len);
        if (tok == DSML) { b = DSV4_DSML_TEXT; len = strlen(b); }
        if (tok == THINK_END) { b = DSV4_THINK_END_TEXT; len = strlen(b); }
        assert_non_null(b);
        memcpy(text + n, b, len);
        n += len;
    }
    dsv4_cstate_free(s);
    free(bits);
    free(allowed);
    int calls = -1;
    if (complete) {
        dsv4_dsml_parser *p = dsv4_dsml_new(thinking, NULL);
        dsv4_dsml_feed(p, text, n);
        if (dsv4_dsml_finish(p) != DSV4_DSML_OK) fail_msg("not DSML (%s): %.*s", dsv4_dsml_error(p), (int)n, text);
        calls = dsv4_dsml_n_calls(p);
        for (int i = 0; i < calls; i++) {
            const dsv4_tool_call *c = dsv4_dsml_call(p, i);
            if (only && strcmp(c->name, only)) fail_msg("call to %s, not %s", c->name, only);
            const json_t *fn = tool_fn(tools, c->name);
            if (!fn) fail_msg("call to unknown tool %s", c->name);
            const json_t *schema = json_object_get(fn, "parameters");
            json_error_t je;
            json_t *args = json_loads(c->arguments, 0, &je);
            if (!args) fail_msg("arguments not JSON: %s", c->arguments);
            char why[200];
            /* auto mode constrains the arguments of strict tools only */
            if ((!start_block || json_is_true(json_object_get(fn, "strict"))) && !mv_valid(schema, schema, args, why, sizeof why))
                fail_msg("%s(%s): %s", c->name, c->arguments, why);
            json_decref(args);
        }
        dsv4_dsml_free(p);
    }
    free(text);
    return calls;
}

static void test_modes(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    json_error_t je;
    json_t *tools = json_loads(TOOLS, 0, &je);
    assert_non_null(tools);
    dsv4_error err;
    struct { dsv4_tools_mode mode; const char *named; int thinking; } M[] = {
        { DSV4_TOOLS_REQUIRED, NULL, 0 }, { DSV4_TOOLS_NAMED, "get_weather", 0 }, { DSV4_TOOLS_NAMED, "tag", 1 },
        { DSV4_TOOLS_REQUIRED, NULL, 1 }, { DSV4_TOOLS_AUTO, NULL, 0 },
    };
    for (size_t m = 0; m < sizeof M / sizeof *M; m++) {
        dsv4_grammar *g;
        if (dsv4_grammar_tool_calls(tools, M[m].mode, M[m].named, M[m].thinking, &g, &err)) fail_msg("%s", err.msg);
        int with_calls = 0, ended = 0;
        for (uint64_t seed = 1; seed <= 60; seed++) {
            const int auto_block = M[m].mode == DSV4_TOOLS_AUTO && seed % 2;
            const int calls = walk(g, v, tools, M[m].thinking, seed * 31 + m, 600, M[m].named, auto_block);
            if (calls < 0) continue;
            ended++;
            if (M[m].mode == DSV4_TOOLS_NAMED) assert_int_equal(calls, 1);
            if (M[m].mode == DSV4_TOOLS_REQUIRED || auto_block) assert_true(calls >= 1);
            with_calls += calls > 0;
        }
        /* the walks are uniform over allowed tokens: most end inside 600 bytes; auto mode: both kinds of reply */
        if (ended < 30) fail_msg("mode %zu: only %d of 60 walks completed", m, ended);
        if (M[m].mode == DSV4_TOOLS_AUTO && (with_calls == 0 || with_calls == ended))
            fail_msg("auto mode: %d of %d replies with calls", with_calls, ended);
        dsv4_grammar_free(g);
    }
    json_decref(tools);
    dsv4_cvocab_free(v);
}

/* The reply the chat template writes for a call is accepted token by token (text as single bytes). */
static void test_template_reply(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    json_error_t je;
    json_t *tools = json_loads(TOOLS, 0, &je);
    dsv4_error err;
    dsv4_grammar *g;
    assert_int_equal(dsv4_grammar_tool_calls(tools, DSV4_TOOLS_REQUIRED, NULL, 0, &g, &err), 0);
    /* spec 2.3: "\n\n<｜DSML｜tool_calls>\n" invokes "\n</｜DSML｜tool_calls>"; markers = the special token */
    const char *pieces[] = { "\n\n<", "D", "tool_calls>\n<", "D", "invoke name=\"get_weather\">\n<", "D",
                             "parameter name=\"location\" string=\"true\">Paris</", "D", "parameter>\n<", "D",
                             "parameter name=\"unit\" string=\"false\">\"celsius\"</", "D", "parameter>\n</", "D",
                             "invoke>\n<", "D", "invoke name=\"ping\">\n\n</", "D", "invoke>\n</", "D", "tool_calls>", NULL };
    dsv4_cstate *s;
    assert_int_equal(dsv4_cstate_new(g, v, -1, &s, &err), 0);
    for (int i = 0; pieces[i]; i++) {
        if (!strcmp(pieces[i], "D")) { assert_int_equal(dsv4_cstate_advance(s, DSML, &err), 0); continue; }
        for (const char *c = pieces[i]; *c; c++)
            if (dsv4_cstate_advance(s, (unsigned char)*c, &err)) fail_msg("piece %d byte '%c': %s", i, *c, err.msg);
    }
    assert_true(dsv4_cstate_complete(s));
    dsv4_cstate_free(s);
    /* the marker spelled out as text is not the marker */
    assert_int_equal(dsv4_cstate_new(g, v, -1, &s, &err), 0);
    for (const char *c = "\n\n<"; *c; c++) assert_int_equal(dsv4_cstate_advance(s, (unsigned char)*c, &err), 0);
    assert_false(dsv4_cstate_allows(s, (unsigned char)DSV4_DSML_TEXT[0]));
    dsv4_cstate_free(s);
    dsv4_grammar_free(g);
    /* errors */
    assert_int_not_equal(dsv4_grammar_tool_calls(tools, DSV4_TOOLS_NAMED, "nope", 0, &g, &err), 0);
    assert_non_null(strstr(err.msg, "nope"));
    json_t *bad = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                             "\"properties\":{\"x\":{\"type\":\"string\",\"format\":\"email\"}}}}}]", 0, &je);
    assert_int_not_equal(dsv4_grammar_tool_calls(bad, DSV4_TOOLS_REQUIRED, NULL, 0, &g, &err), 0);
    assert_non_null(strstr(err.msg, "format"));
    assert_non_null(strstr(err.msg, "'f'"));
    json_decref(bad);
    /* a parameter name DSML cannot carry: the message names it (it is formatted before the name list is freed,
     * which ASan checks here) */
    bad = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                     "\"properties\":{\"ok\":{\"type\":\"string\"},\"a<b\":{\"type\":\"string\"}}}}}]", 0, &je);
    assert_int_not_equal(dsv4_grammar_tool_calls(bad, DSV4_TOOLS_REQUIRED, NULL, 0, &g, &err), 0);
    assert_non_null(strstr(err.msg, "parameter name 'a<b' cannot be written in DSML"));
    json_decref(bad);
    json_decref(tools);
    dsv4_cvocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_template_reply),
        cmocka_unit_test(test_modes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
