/* Constraint engine (issue 13) without a model:
 *   - accept/reject tables per JSON Schema keyword, JSON mode, the pattern subset and the GBNF form: strings
 *     written by hand with the expected answer reasoned by hand from the documented output form;
 *   - clear errors (naming the keyword / the line) for unsupported keywords, malformed schemas and grammars;
 *   - the mask equals a brute-force check of every token on every prefix of random walks (trie walk and cache
 *     against walking each token's bytes alone);
 *   - length bound: uniform random walks over the allowed tokens always end with EOS within max_bytes + 1
 *     tokens, and the output parses (jansson) and validates against the schema with an independent validator
 *     (tests/unit/helpers/mini_validator.c);
 *   - rollback: a saved position restores the exact allowed set. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/constraint.h"
#include "engine/grammar.h"
#include "engine/json_schema.h"
#include "helpers/mini_validator.h"

/* ---- a vocabulary: the 256 single bytes, EOS, a special token, and multi-byte tokens -------------------- */

#define EOS 256
#define SPECIAL 257
static const char *const MULTI[] = { "{\"", "\":", "\",\"", "true", "false", "null", "  ", "ab", "\"}", "12", "},{",
                                     "\"a\"", "[[", "]]", "\\u00", "é", "\xe6\x97\xa5", "\xe6", "\x97\xa5", "0.5",
                                     "e-", ",\n  ", "\":\"", "hello", " world", "-1", "\"\"", NULL };

static dsv4_cvocab *make_vocab(void) {
    const char *bytes[400] = {0};
    size_t lens[400] = {0};
    static char single[256];
    for (int i = 0; i < 256; i++) { single[i] = (char)i; bytes[i] = &single[i]; lens[i] = 1; }
    int n = 258;
    for (int i = 0; MULTI[i]; i++, n++) { bytes[n] = MULTI[i]; lens[n] = strlen(MULTI[i]); }
    /* SPECIAL (257) has no bytes: like an added token it is never allowed */
    dsv4_cvocab *v;
    dsv4_error err;
    if (dsv4_cvocab_new(bytes, lens, n, EOS, &v, &err)) fail_msg("vocab: %s", err.msg);
    return v;
}

static dsv4_grammar *schema_grammar(const char *schema, int ws) {
    dsv4_grammar *g;
    dsv4_error err;
    const dsv4_schema_opts o = { ws };
    if (dsv4_grammar_from_schema_text(schema, strlen(schema), &o, &g, &err)) fail_msg("schema %s: %s", schema, err.msg);
    return g;
}

/* Feed text byte by byte (single-byte tokens); 1 when every byte is allowed and the value is complete. */
static int accepts(const dsv4_grammar *g, const dsv4_cvocab *v, const char *text) {
    dsv4_cstate *s;
    dsv4_error err;
    if (dsv4_cstate_new(g, v, -1, &s, &err)) fail_msg("%s", err.msg);
    int ok = 1;
    for (const unsigned char *p = (const unsigned char *)text; *p && ok; p++) {
        if (!dsv4_cstate_allows(s, *p)) ok = 0;
        else if (dsv4_cstate_advance(s, *p, &err)) fail_msg("advance after allows: %s", err.msg);
    }
    ok = ok && dsv4_cstate_complete(s) && dsv4_cstate_allows(s, EOS);
    assert_false(dsv4_cstate_allows(s, SPECIAL));
    dsv4_cstate_free(s);
    return ok;
}

typedef struct { const char *text; int ok; } tcase;

static void run_table(const char *schema, int ws, const tcase *t) {
    dsv4_cvocab *v = make_vocab();
    dsv4_grammar *g = schema_grammar(schema, ws);
    for (; t->text; t++) {
        const int got = accepts(g, v, t->text);
        if (got != t->ok) fail_msg("schema %s: '%s' %s, expected %s", schema, t->text, got ? "accepted" : "rejected", t->ok ? "accept" : "reject");
    }
    dsv4_grammar_free(g);
    dsv4_cvocab_free(v);
}

/* ---- tables ----------------------------------------------------------------------------------------------- */

static void test_scalars(void **state) {
    (void)state;
    run_table("{\"type\":\"string\"}", 0, (const tcase[]){
        {"\"abc\"", 1}, {"\"\"", 1}, {"\"a\\\"b\"", 1}, {"\"\\u00e9\"", 1}, {"\"\xc3\xa9\"", 1}, {"\"\\n\\t\\/\"", 1},
        {"abc", 0}, {"\"abc", 0}, {"\"a\"b\"", 0}, {"\"\x01\"", 0}, {"\"\\ud800\"", 0}, {"\"\\u0000\"", 0},
        {"\"\\x\"", 0}, {"\"\\u0001\\u0010\\u0100\\uD7FF\\uE000\"", 1}, {"\"\\u00001\"", 0}, {"\"\\uDC00\"", 0}, {"\"\xc3\"", 0}, {"\"\xed\xa0\x80\"", 0} /* a surrogate in UTF-8 */, {" \"a\"", 0}, {NULL, 0}});
    run_table("{\"type\":\"integer\"}", 0, (const tcase[]){
        {"0", 1}, {"-5", 1}, {"123456789012345", 1}, {"-0", 1},
        {"01", 0}, {"1.0", 0}, {"1234567890123456", 0}, {"-", 0}, {"+1", 0}, {"1e3", 0}, {"", 0}, {NULL, 0}});
    run_table("{\"type\":\"number\"}", 0, (const tcase[]){
        {"0", 1}, {"-1.5", 1}, {"2e10", 1}, {"1.25E-3", 1}, {"7", 1},
        {".5", 0}, {"1.", 0}, {"1e", 0}, {"NaN", 0}, {"01.5", 0}, {"1e123", 0}, {NULL, 0}});
    run_table("{\"type\":\"boolean\"}", 0, (const tcase[]){ {"true", 1}, {"false", 1}, {"True", 0}, {"1", 0}, {"tru", 0}, {NULL, 0}});
    run_table("{\"type\":\"null\"}", 0, (const tcase[]){ {"null", 1}, {"nul", 0}, {"\"null\"", 0}, {NULL, 0}});
    run_table("{\"type\":[\"string\",\"null\"]}", 0, (const tcase[]){ {"\"x\"", 1}, {"null", 1}, {"1", 0}, {"true", 0}, {NULL, 0}});
}

static void test_objects(void **state) {
    (void)state;
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},\"required\":[\"a\"]}";
    run_table(s, 4, (const tcase[]){
        {"{\"a\":1}", 1}, {"{\"a\":1,\"b\":\"x\"}", 1}, {"{ \"a\": 1 }", 1}, {"{\n  \"a\": 1,\n  \"b\": \"\"\n}", 1},
        {"{    \"a\":1}", 1}, /* 4 blanks: the bound */
        {"{     \"a\":1}", 0}, /* 5 */
        {"{}", 0}, {"{\"b\":\"x\",\"a\":1}", 0} /* schema order */, {"{\"a\":1,\"c\":2}", 0}, {"{\"a\":\"1\"}", 0},
        {"{\"a\":1,}", 0}, {"{\"a\":1 \"b\":\"x\"}", 0}, {NULL, 0}});
    run_table(s, 0, (const tcase[]){ {"{\"a\":1}", 1}, {"{ \"a\":1}", 0}, {"{\"a\": 1}", 0}, {NULL, 0}});
    /* all optional: commas only between present members */
    run_table("{\"properties\":{\"x\":{\"type\":\"null\"},\"y\":{\"type\":\"null\"},\"z\":{\"type\":\"null\"}}}", 0, (const tcase[]){
        {"{}", 1}, {"{\"y\":null}", 1}, {"{\"x\":null,\"z\":null}", 1}, {"{\"x\":null,\"y\":null,\"z\":null}", 1},
        {"{,\"y\":null}", 0}, {"{\"x\":null,}", 0}, {"{\"z\":null,\"x\":null}", 0}, {NULL, 0}});
    /* additionalProperties as a schema: extra keys differ from the declared ones */
    run_table("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":{\"type\":\"boolean\"}}", 0, (const tcase[]){
        {"{\"a\":1,\"x\":true}", 1}, {"{\"x\":false}", 1}, {"{\"a\":1,\"ab\":true}", 1}, {"{\"a\":1,\"\":true}", 1},
        {"{\"a\":1,\"b\":true,\"c\":false}", 1},
        {"{\"a\":1,\"a\":true}", 0}, {"{\"x\":1}", 0}, {"{\"a\":1,\"x\":\"s\"}", 0}, {NULL, 0}});
    run_table("{\"type\":\"object\",\"additionalProperties\":true}", 0, (const tcase[]){
        {"{\"k\":[1,{}]}", 1}, {"{}", 1}, {"{\"a\":1,\"a\":2}", 1}, {"{k:1}", 0}, {NULL, 0}});
    run_table("{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1}},\"additionalProperties\":false}", 0, (const tcase[]){
        {"{\"a\":1}", 1}, {"{}", 1}, {"{\"b\":1}", 0}, {NULL, 0}});
    /* required names that are not in properties come after them, with any value */
    run_table("{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"z\"]}", 0, (const tcase[]){
        {"{\"z\":[true]}", 1}, {"{\"a\":2,\"z\":null}", 1}, {"{\"a\":2}", 0}, {NULL, 0}});
    /* nested objects */
    run_table("{\"type\":\"object\",\"properties\":{\"o\":{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"boolean\"}},\"required\":[\"p\"]}},\"required\":[\"o\"]}", 0,
              (const tcase[]){ {"{\"o\":{\"p\":true}}", 1}, {"{\"o\":{}}", 0}, {"{\"o\":{\"p\":true}", 0}, {NULL, 0}});
}

static void test_enum_const(void **state) {
    (void)state;
    run_table("{\"enum\":[\"red\",\"green\",3,null,[1,\"x\"]]}", 0, (const tcase[]){
        {"\"red\"", 1}, {"3", 1}, {"null", 1}, {"[1,\"x\"]", 1}, {"\"blue\"", 0}, {"\"Red\"", 0}, {"4", 0}, {"[1, \"x\"]", 0}, {NULL, 0}});
    run_table("{\"const\":{\"a\":[1,2]}}", 0, (const tcase[]){ {"{\"a\":[1,2]}", 1}, {"{\"a\":[1,2,3]}", 0}, {"{\"a\": [1,2]}", 0}, {NULL, 0}});
    run_table("{\"type\":\"string\",\"enum\":[\"a\",1]}", 0, (const tcase[]){ {"\"a\"", 1}, {"1", 0}, {NULL, 0}});
    run_table("{\"const\":\"\xc3\xa9\\\"\"}", 0, (const tcase[]){ {"\"\xc3\xa9\\\"\"", 1}, {"\"\xc3\xa9\"", 0}, {NULL, 0}});
}

static void test_arrays(void **state) {
    (void)state;
    run_table("{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}", 1, (const tcase[]){
        {"[]", 1}, {"[1,2,3]", 1}, {"[ 1, 2 ]", 1}, {"[1,]", 0}, {"[\"a\"]", 0}, {"[1 2]", 0}, {"[,1]", 0}, {NULL, 0}});
    run_table("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}", 0, (const tcase[]){
        {"[]", 1}, {"[\"a\"]", 1}, {"[\"a\",1]", 1}, {"[\"a\",1,2]", 0}, {"[1]", 0}, {NULL, 0}});
    run_table("{\"prefixItems\":[{\"const\":\"x\"}],\"items\":{\"type\":\"boolean\"},\"minItems\":2}", 0, (const tcase[]){
        {"[\"x\",true]", 1}, {"[\"x\",true,false]", 1}, {"[\"x\"]", 0}, {"[true,true]", 0}, {"[]", 0}, {NULL, 0}});
    run_table("{\"type\":\"array\",\"items\":{\"type\":\"null\"},\"minItems\":1,\"maxItems\":2}", 0, (const tcase[]){
        {"[null]", 1}, {"[null,null]", 1}, {"[]", 0}, {"[null,null,null]", 0}, {NULL, 0}});
    run_table("{\"type\":\"array\"}", 0, (const tcase[]){ {"[1,\"a\",{\"b\":[]}]", 1}, {"[]", 1}, {"[", 0}, {NULL, 0}});
    run_table("{\"type\":\"array\",\"maxItems\":0}", 0, (const tcase[]){ {"[]", 1}, {"[1]", 0}, {NULL, 0}});
}

static void test_strings(void **state) {
    (void)state;
    run_table("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", 0, (const tcase[]){
        {"\"ab\"", 1}, {"\"abc\"", 1}, {"\"a\\n\"", 1}, {"\"\xc3\xa9\xc3\xa9\"", 1}, {"\"\\u00e9xy\"", 1},
        {"\"a\"", 0}, {"\"abcd\"", 0}, {"\"\"", 0}, {"\"\xc3\xa9\"", 0}, {NULL, 0}});
    run_table("{\"type\":\"string\",\"pattern\":\"^[a-z]+-[0-9]{2}$\"}", 0, (const tcase[]){
        {"\"ab-12\"", 1}, {"\"z-00\"", 1}, {"\"ab-1\"", 0}, {"\"AB-12\"", 0}, {"\"ab-123\"", 0}, {"\"-12\"", 0}, {NULL, 0}});
    run_table("{\"type\":\"string\",\"pattern\":\"ab\"}", 0, (const tcase[]){
        {"\"xxabyy\"", 1}, {"\"ab\"", 1}, {"\"a\\\"ab\"", 1}, {"\"a b\"", 0}, {"\"\"", 0}, {NULL, 0}});
    run_table("{\"type\":\"string\",\"pattern\":\"^(foo|ba(r|z))?\\\\d*$\"}", 0, (const tcase[]){
        {"\"\"", 1}, {"\"foo12\"", 1}, {"\"baz\"", 1}, {"\"bar0\"", 1}, {"\"ba\"", 0}, {"\"fooo\"", 0}, {"\"12a\"", 0}, {NULL, 0}});
    run_table("{\"type\":\"string\",\"pattern\":\"^a\\\"b\\\\\\\\c$\"}", 0, (const tcase[]){ /* pattern a"b\\c: a, quote, b, backslash, c */
        {"\"a\\\"b\\\\c\"", 1}, {"\"ab\\\\c\"", 0}, {"\"a\\\"bc\"", 0}, {NULL, 0}});
    run_table("{\"type\":\"string\",\"pattern\":\"^[^a-c]\\\\s.x{2,3}[\\\\w-]?$\"}", 0, (const tcase[]){
        {"\"d \xc3\xa9xx\"", 1}, {"\"\\\" zxxx_\"", 1}, {"\"d\\tqxx-\"", 1},
        {"\"a zxx\"", 0}, {"\"dzzxx\"", 0}, {"\"d zxxxxx\"", 0}, {"\"d \\nxx\"", 0}, {NULL, 0}});
}

static void test_integer_ranges(void **state) {
    (void)state;
    run_table("{\"type\":\"integer\",\"minimum\":-12,\"maximum\":105}", 0, (const tcase[]){
        {"-12", 1}, {"-1", 1}, {"0", 1}, {"7", 1}, {"10", 1}, {"99", 1}, {"100", 1}, {"105", 1},
        {"-13", 0}, {"106", 0}, {"200", 0}, {"1000", 0}, {"010", 0}, {"-0", 0}, {"-", 0}, {NULL, 0}});
    run_table("{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":10}", 0, (const tcase[]){
        {"1", 1}, {"9", 1}, {"0", 0}, {"10", 0}, {NULL, 0}});
    run_table("{\"type\":\"integer\",\"minimum\":100}", 0, (const tcase[]){
        {"100", 1}, {"999999", 1}, {"101", 1}, {"99", 0}, {"-100", 0}, {"1000000000000000", 0}, {NULL, 0}});
    run_table("{\"type\":\"integer\",\"minimum\":-7305,\"maximum\":-7298}", 0, (const tcase[]){
        {"-7305", 1}, {"-7300", 1}, {"-7298", 1}, {"-7299", 1}, {"-7297", 0}, {"-7306", 0}, {"7300", 0}, {NULL, 0}});
    run_table("{\"type\":\"integer\",\"maximum\":3.5,\"minimum\":2.5}", 0, (const tcase[]){ {"3", 1}, {"2", 0}, {"4", 0}, {NULL, 0}});
}

static void test_combinators_refs(void **state) {
    (void)state;
    const tcase alt[] = { {"5", 1}, {"{\"k\":1}", 1}, {"{\"k\":2}", 0}, {"\"5\"", 0}, {NULL, 0} };
    run_table("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":1}},\"required\":[\"k\"]}]}", 0, alt);
    run_table("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":1}},\"required\":[\"k\"]}]}", 0, alt);
    run_table("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},"
              "\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}", 0, (const tcase[]){
        {"{\"v\":1,\"next\":null}", 1}, {"{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3,\"next\":null}}}", 1},
        {"{\"v\":1}", 0}, {"{\"v\":1,\"next\":{\"v\":2}}", 0}, {NULL, 0}});
    run_table("{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", 0, (const tcase[]){ {"[]", 1}, {"[[],[[]]]", 1}, {"[1]", 0}, {"[[]", 0}, {NULL, 0}});
    run_table("{\"definitions\":{\"a\":{\"type\":\"boolean\"}},\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/definitions/a\"}},\"required\":[\"x\"],"
              "\"title\":\"t\",\"description\":\"d\",\"$schema\":\"https://json-schema.org/draft/2020-12/schema\"}", 0,
              (const tcase[]){ {"{\"x\":true}", 1}, {"{\"x\":1}", 0}, {NULL, 0}});
}

static void test_json_mode(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    dsv4_grammar *g;
    dsv4_error err;
    const dsv4_schema_opts o = { 1 };
    assert_int_equal(dsv4_grammar_json_any(&o, &g, &err), 0);
    const tcase t[] = { {"{\"a\":[1,2.5,\"x\",null,true,{\"b\":{}}]}", 1}, {"\"s\"", 1}, {"1", 1}, {"[ ]", 1}, {"{ \"a\" : [ ] }", 1},
                        {"{a:1}", 0}, {"[1,]", 0}, {"{\"a\" 1}", 0}, {"", 0}, {"{\"a\":1}}", 0}, {"[   ]", 0}, {"'a'", 0}, {NULL, 0} };
    for (const tcase *c = t; c->text; c++)
        if (accepts(g, v, c->text) != c->ok) fail_msg("json mode: '%s' expected %d", c->text, c->ok);
    dsv4_grammar_free(g);
    dsv4_cvocab_free(v);
}

static dsv4_grammar *gbnf(const char *text) {
    dsv4_grammar *g;
    dsv4_error err;
    if (dsv4_grammar_from_gbnf(text, strlen(text), &g, &err)) fail_msg("grammar: %s", err.msg);
    return g;
}

static void test_gbnf(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    struct { const char *grammar; tcase t[8]; } G[] = {
        {"# greeting\nroot ::= greeting \" \" name \"!\"\ngreeting ::= \"hello\" | \"hi\"\nname ::= [A-Z] [a-z]*\n",
         {{"hello Bob!", 1}, {"hi X!", 1}, {"hey Bob!", 0}, {"hello bob!", 0}, {"hello Bob", 0}, {NULL, 0}}},
        {"root ::= \"(\" root \")\" | \"\"", {{"", 1}, {"(())", 1}, {"(()", 0}, {")", 0}, {NULL, 0}}},
        {"root ::= ( [0-9]{2,3} \",\" )+ \"\\n\"", {{"12,\n", 1}, {"12,345,\n", 1}, {"1,\n", 0}, {"1234,\n", 0}, {"12,", 0}, {NULL, 0}}},
        {"root ::= [^a-z\\n] . \"\\u00e9\"?", {{"A\xe6\x97\xa5", 1}, {"Ab\xc3\xa9", 1}, {"ab", 0}, {"\nb", 0}, {"A", 0}, {NULL, 0}}},
        {"root ::= item (\",\" item){0,1}\nitem ::=\n   \"x\"\n | \"y\" # trailing comment\n", {{"x", 1}, {"x,y", 1}, {"x,y,x", 0}, {"", 0}, {NULL, 0}}},
        /* stacked postfix operators (folded into one repetition when both are *, + or ?; grammar.c parse_item) */
        {"root ::= \"a\"+? \"b\"", {{"b", 1}, {"aaab", 1}, {"ba", 0}, {NULL, 0}}},
        {"root ::= \"ab\"?+ \"c\"", {{"c", 1}, {"ababc", 1}, {"abac", 0}, {NULL, 0}}},
        {"root ::= \"a\"++ \"b\"", {{"ab", 1}, {"aaab", 1}, {"b", 0}, {NULL, 0}}},
        {"root ::= \"a\"?? \"b\"", {{"b", 1}, {"ab", 1}, {"aab", 0}, {NULL, 0}}},
        {"root ::= \"a\"+{2} \"b\"", {{"aab", 1}, {"aaaab", 1}, {"ab", 0}, {NULL, 0}}},
        {"root ::= \"a\"{2}+ \"b\"", {{"aab", 1}, {"aaaab", 1}, {"aaab", 0}, {"b", 0}, {NULL, 0}}},
        {"root ::= \"a\"{0,1}* \"b\"", {{"b", 1}, {"aaab", 1}, {NULL, 0}}},
        {"root ::= \"a\"+++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++++ \"b\"",
         {{"ab", 1}, {"aaaaaaaaaaab", 1}, {"b", 0}, {NULL, 0}}},
    };
    for (size_t i = 0; i < sizeof G / sizeof G[0]; i++) {
        dsv4_grammar *g = gbnf(G[i].grammar);
        for (const tcase *c = G[i].t; c->text; c++)
            if (accepts(g, v, c->text) != c->ok) fail_msg("grammar %zu: '%s' expected %d", i, c->text, c->ok);
        dsv4_grammar_free(g);
    }
    dsv4_cvocab_free(v);
}

/* ---- errors ------------------------------------------------------------------------------------------------ */

static void expect_schema_error(const char *schema, int code, const char *needle) {
    dsv4_grammar *g = NULL;
    dsv4_error err = {0};
    const int rc = dsv4_grammar_from_schema_text(schema, strlen(schema), NULL, &g, &err);
    if (rc != code || !strstr(err.msg, needle) || strchr(err.msg, '\n'))
        fail_msg("schema %s: rc %d (expected %d), message '%s' lacks '%s'", schema, rc, code, err.msg, needle);
    assert_null(g);
}

static void expect_grammar_error(const char *text, const char *needle) {
    dsv4_grammar *g = NULL;
    dsv4_error err = {0};
    const int rc = dsv4_grammar_from_gbnf(text, strlen(text), &g, &err);
    if (rc == 0 || !strstr(err.msg, needle) || strchr(err.msg, '\n'))
        fail_msg("grammar %s: rc %d, message '%s' lacks '%s'", text, rc, err.msg, needle);
    assert_null(g);
}

static void test_errors(void **state) {
    (void)state;
    expect_schema_error("{\"type\":\"string\",\"format\":\"date\"}", DSV4_E_UNSUPPORTED, "unsupported keyword \"format\"");
    expect_schema_error("{\"allOf\":[{\"type\":\"string\"}]}", DSV4_E_UNSUPPORTED, "\"allOf\"");
    expect_schema_error("{\"properties\":{\"a\":{\"type\":\"object\",\"patternProperties\":{}}}}", DSV4_E_UNSUPPORTED, "#/properties/a");
    expect_schema_error("{\"type\":\"number\",\"minimum\":1}", DSV4_E_UNSUPPORTED, "integers only");
    expect_schema_error("{\"type\":\"integer\",\"minLength\":1}", DSV4_E_ARG, "\"minLength\" does not apply");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"(?=a)\"}", DSV4_E_UNSUPPORTED, "lookaround");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"a\\\\1\"}", DSV4_E_UNSUPPORTED, "unsupported escape");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"a+?\"}", DSV4_E_UNSUPPORTED, "lazy");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"(a\"}", DSV4_E_UNSUPPORTED, "parenthesis");
    expect_schema_error("{\"type\":\"strin\"}", DSV4_E_ARG, "unknown type");
    expect_schema_error("{\"$ref\":\"#/$defs/missing\"}", DSV4_E_ARG, "points to nothing");
    expect_schema_error("{\"$ref\":\"http://x/y.json\"}", DSV4_E_UNSUPPORTED, "only local references");
    expect_schema_error("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", DSV4_E_ARG, "no integer");
    expect_schema_error("{\"enum\":[]}", DSV4_E_ARG, "non-empty");
    expect_schema_error("{\"type\":\"array\",\"minItems\":3,\"maxItems\":1}", DSV4_E_ARG, "minItems");
    expect_schema_error("{\"type\":\"string\",\"minLength\":1,\"pattern\":\"a\"}", DSV4_E_UNSUPPORTED, "pattern");
    expect_schema_error("{\"type\":\"object\",", DSV4_E_FORMAT, "not JSON");
    expect_schema_error("[1,2]", DSV4_E_ARG, "must be an object");
    expect_schema_error("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", DSV4_E_ARG, "left-recursive");
    expect_schema_error("{\"$defs\":{\"a\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/a\"},\"minItems\":1}},\"$ref\":\"#/$defs/a\"}", DSV4_E_ARG,
                        "never finish");
    expect_schema_error("{\"type\":\"string\",\"maxLength\":1000000}", DSV4_E_UNSUPPORTED, "maxLength");
    {
        /* a 5000-byte property name beside additionalProperties: refused, not a deep recursion */
        char big[6000];
        int n = snprintf(big, sizeof big, "{\"properties\":{\"");
        memset(big + n, 'k', 5000);
        n += 5000;
        snprintf(big + n, sizeof big - (size_t)n, "\":{}},\"additionalProperties\":true}");
        expect_schema_error(big, DSV4_E_UNSUPPORTED, "longer than 1024");
        expect_schema_error("{\"$ref\":\"#\"}", DSV4_E_ARG, "left-recursive");
    }
    expect_grammar_error("root ::= root \"a\" | \"b\"", "left-recursive");
    expect_grammar_error("root ::= foo", "'foo' is used but never defined");
    expect_grammar_error("start ::= \"a\"", "no rule named 'root'");
    expect_grammar_error("root ::= \"a\" root", "never finish");
    expect_grammar_error("root ::= \"a\"\nroot ::= \"b\"", "defined twice");
    expect_grammar_error("root ::= \"a\n", "unterminated string");
    expect_grammar_error("root ::= \"a\"\n  x ::= [b-a]", "line 2");
    expect_grammar_error("root ::= (\"a\"", "missing ')'");
    expect_grammar_error("root ::= \"a\"{3,1}", "m < n");
    expect_grammar_error("root ::= ~", "unexpected character");
    /* UTF-8 in literals and classes is the shortest form of a scalar value (the fuzzer's find: F6 88 90 94 was
     * taken as U+188414 and came back out as bytes no UTF-8 decoder accepts) */
    expect_grammar_error("root ::= \"\xF6\x88\x90\x94\"", "ill-formed UTF-8");
    expect_grammar_error("root ::= \"\xF4\x90\x80\x80\"", "ill-formed UTF-8");   /* U+110000 */
    expect_grammar_error("root ::= \"\xC0\x80\"", "ill-formed UTF-8");             /* overlong NUL */
    expect_grammar_error("root ::= [\xE0\x80\xAF]", "ill-formed UTF-8");            /* overlong '/' */
    expect_grammar_error("root ::= [a-\xED\xA0\x80]", "ill-formed UTF-8");          /* a surrogate */
    expect_grammar_error("root ::= \"\x80\"", "ill-formed UTF-8");                  /* a lone continuation */
    {
        /* the largest scalar value and the edges of the surrogate gap still compile */
        dsv4_grammar *g = NULL;
        dsv4_error err = {0};
        const char *ok = "root ::= \"\xF4\x8F\xBF\xBF\" [\xED\x9F\xBF\xEE\x80\x80] \"\xC2\x80\"";
        if (dsv4_grammar_from_gbnf(ok, strlen(ok), &g, &err)) fail_msg("grammar %s: %s", ok, err.msg);
        dsv4_grammar_free(g);
    }
}

/* ---- masks: brute force, length bound, validity, rollback ----------------------------------------------- */

static uint64_t rng_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static const char *const WALK_SCHEMAS[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bc\"]},\"maxItems\":4},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}",
    "{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"object\",\"additionalProperties\":{\"type\":[\"integer\",\"null\"]}}]}",
    "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},"
    "\"required\":[\"v\",\"kids\"]}},\"$ref\":\"#/$defs/t\"}",
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},\"n\":{\"type\":\"integer\",\"exclusiveMinimum\":-50}},"
    "\"required\":[\"code\"],\"additionalProperties\":{\"const\":\"x\"}}",
    "true",
    "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"null\"},{\"type\":\"string\",\"minLength\":3}],\"items\":{\"type\":\"integer\"},\"minItems\":3}",
    NULL};

/* Brute force: every token's answer from allows() on its own equals its bit in the mask. */
static void check_mask(dsv4_cstate *s, const dsv4_cvocab *v, uint64_t *bits) {
    dsv4_error err;
    assert_int_equal(dsv4_cstate_allowed(s, bits, &err), 0);
    for (int32_t id = 0; id < dsv4_cvocab_size(v); id++) {
        const int bit = (int)((bits[id >> 6] >> (id & 63)) & 1);
        if (bit != dsv4_cstate_allows(s, id)) fail_msg("token %d: mask says %d, allows says %d", id, bit, !bit);
    }
}

static void test_random_walks(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    const int V = dsv4_cvocab_size(v);
    uint64_t *bits = malloc(sizeof *bits * (size_t)((V + 63) / 64));
    int32_t *allowed = malloc(sizeof *allowed * (size_t)V);
    char *out = malloc(4096);
    for (int si = 0; WALK_SCHEMAS[si]; si++) {
        json_error_t je;
        json_t *schema = json_loads(WALK_SCHEMAS[si], JSON_DECODE_ANY, &je);
        assert_non_null(schema);
        dsv4_grammar *g = schema_grammar(WALK_SCHEMAS[si], 2);
        for (int seed = 0; seed < 25; seed++) {
            uint64_t rng = (uint64_t)seed * 7919 + (uint64_t)si;
            const int64_t max_bytes = 40 + (int64_t)(rng_next(&rng) % 160);
            dsv4_cstate *s;
            dsv4_error err;
            assert_int_equal(dsv4_cstate_new(g, v, max_bytes, &s, &err), 0);
            size_t n_out = 0;
            int steps = 0, ended = 0;
            for (; steps <= max_bytes + 1; steps++) {
                if (seed < 3) check_mask(s, v, bits);
                else assert_int_equal(dsv4_cstate_allowed(s, bits, &err), 0);
                int n_allowed = 0;
                for (int32_t id = 0; id < V; id++)
                    if ((bits[id >> 6] >> (id & 63)) & 1) allowed[n_allowed++] = id;
                assert_true(n_allowed > 0);
                assert_false((bits[SPECIAL >> 6] >> (SPECIAL & 63)) & 1);
                const int32_t tok = allowed[rng_next(&rng) % (uint64_t)n_allowed];
                /* rollback: after trying the token, the saved position gives back the same set */
                if (steps % 7 == 3) {
                    const dsv4_cpos p = dsv4_cstate_get(s);
                    assert_int_equal(dsv4_cstate_advance(s, tok, &err), 0);
                    dsv4_cstate_set(s, p);
                    uint64_t *again = malloc(sizeof *again * (size_t)((V + 63) / 64));
                    assert_int_equal(dsv4_cstate_allowed(s, again, &err), 0);
                    assert_memory_equal(again, bits, sizeof *bits * (size_t)((V + 63) / 64));
                    free(again);
                }
                if (tok == EOS) {
                    assert_true(dsv4_cstate_complete(s));
                    assert_int_equal(dsv4_cstate_advance(s, tok, &err), 0);
                    ended = 1;
                    break;
                }
                size_t len;
                const char *b = dsv4_cvocab_bytes(v, tok, &len);
                assert_non_null(b);
                assert_int_equal(dsv4_cstate_advance(s, tok, &err), 0);
                memcpy(out + n_out, b, len);
                n_out += len;
                assert_true((int64_t)n_out <= max_bytes);
            }
            if (!ended) fail_msg("schema %d seed %d: no EOS within %lld bytes", si, seed, (long long)max_bytes);
            assert_true(dsv4_cstate_finished(s));
            assert_false(dsv4_cstate_allows(s, EOS));
            json_t *val = json_loadb(out, n_out, JSON_DECODE_ANY, &je);
            if (!val) fail_msg("schema %d seed %d: output does not parse (%s): %.*s", si, seed, je.text, (int)n_out, out);
            char why[200];
            if (!mv_valid(schema, schema, val, why, sizeof why))
                fail_msg("schema %d seed %d: output invalid (%s): %.*s", si, seed, why, (int)n_out, out);
            json_decref(val);
            dsv4_cstate_free(s);
        }
        dsv4_grammar_free(g);
        json_decref(schema);
    }
    free(out);
    free(allowed);
    free(bits);
    dsv4_cvocab_free(v);
}

/* lt_escaped (JSON values inside DSML): '<' only as \u003c in every kind of string (plain, enum/const, pattern,
 * declared and extra keys), so the text of a DSML closing tag can never appear; every value stays writable. */
static void test_lt_escaped(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    struct { const char *schema; tcase t[6]; } S[] = {
        {"{\"type\":\"string\"}", {{"\"a\\u003cb\"", 1}, {"\"a<b\"", 0}, {"\"a>b\"", 1}, {NULL, 0}}},
        {"{\"enum\":[\"<x>\"]}", {{"\"\\u003cx>\"", 1}, {"\"<x>\"", 0}, {NULL, 0}}},
        {"{\"type\":\"string\",\"pattern\":\"^<[a-z<]$\"}", {{"\"\\u003ca\"", 1}, {"\"\\u003c\\u003c\"", 1}, {"\"<a\"", 0}, {"\"\\u003c<\"", 0}, {NULL, 0}}},
        {"{\"type\":\"string\",\"pattern\":\"^[^a]$\"}", {{"\"\\u003c\"", 1}, {"\"<\"", 0}, {"\"b\"", 1}, {NULL, 0}}},
        {"{\"type\":\"object\",\"properties\":{\"<k\":{\"const\":1}},\"required\":[\"<k\"]}", {{"{\"\\u003ck\":1}", 1}, {"{\"<k\":1}", 0}, {NULL, 0}}},
        {"{\"type\":\"object\",\"properties\":{\"a<\":{\"const\":1}},\"additionalProperties\":{\"type\":\"integer\"}}", {{"{\"b\":2}", 1}, {"{\"<\":1}", 0}, {"{\"a\":1}", 1}, {NULL, 0}}},
    };
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++) {
        dsv4_grammar *g;
        dsv4_error err;
        const dsv4_schema_opts o = { 0, 1 };
        if (dsv4_grammar_from_schema_text(S[i].schema, strlen(S[i].schema), &o, &g, &err)) fail_msg("%s: %s", S[i].schema, err.msg);
        for (const tcase *c = S[i].t; c->text; c++)
            if (accepts(g, v, c->text) != c->ok) fail_msg("schema %s: '%s' expected %d", S[i].schema, c->text, c->ok);
        dsv4_grammar_free(g);
    }
    /* without the option a raw '<' is fine */
    dsv4_grammar *g = schema_grammar("{\"type\":\"string\"}", 0);
    assert_true(accepts(g, v, "\"a<b\""));
    dsv4_grammar_free(g);
    dsv4_cvocab_free(v);
}

/* Special tokens named by the grammar (@"text"): allowed exactly there, as one token, never as text; counted as
 * one byte of the bound; a grammar naming a token the vocabulary lacks is an error at matcher creation. */
static void test_special_tokens(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    dsv4_error err;
    assert_int_equal(dsv4_cvocab_add_special(v, "<S>", 3, SPECIAL, &err), 0);
    assert_int_not_equal(dsv4_cvocab_add_special(v, "<T>", 3, 'a', &err), 0); /* 'a' has bytes */
    dsv4_grammar *g = gbnf("root ::= \"a\" (@\"<S>\" \"b\")+ | \"c\"\n");
    dsv4_cstate *s;
    assert_int_equal(dsv4_cstate_new(g, v, 4, &s, &err), 0);
    assert_false(dsv4_cstate_allows(s, SPECIAL));             /* not before "a" */
    assert_int_equal(dsv4_cstate_advance(s, 'a', &err), 0);
    assert_true(dsv4_cstate_allows(s, SPECIAL));
    assert_false(dsv4_cstate_allows(s, '<'));                 /* the text of the token is not the token */
    const int V = dsv4_cvocab_size(v);
    uint64_t *bits = malloc(sizeof *bits * (size_t)((V + 63) / 64));
    check_mask(s, v, bits);
    int n = 0;
    for (int32_t id = 0; id < V; id++) n += (int)((bits[id >> 6] >> (id & 63)) & 1);
    assert_int_equal(n, 1);
    assert_int_equal(dsv4_cstate_advance(s, SPECIAL, &err), 0);
    assert_int_equal(dsv4_cstate_get(s).used, 2);              /* "a" + one for the special token */
    assert_false(dsv4_cstate_allows(s, SPECIAL));
    assert_int_equal(dsv4_cstate_advance(s, 'b', &err), 0);
    assert_true(dsv4_cstate_complete(s));
    check_mask(s, v, bits);
    /* used 3 of 4: another special + "b" would need 5 */
    assert_false(dsv4_cstate_allows(s, SPECIAL));
    assert_true(dsv4_cstate_allows(s, EOS));
    dsv4_cstate_free(s);
    free(bits);
    dsv4_grammar_free(g);
    /* a grammar naming a token the vocabulary lacks */
    g = gbnf("root ::= @\"<none>\"\n");
    assert_int_not_equal(dsv4_cstate_new(g, v, -1, &s, &err), 0);
    assert_non_null(strstr(err.msg, "<none>"));
    dsv4_grammar_free(g);
    expect_grammar_error("root ::= @x\n", "special-token text");
    dsv4_cvocab_free(v);
}

/* Ambiguous recursion (the fuzzer's slow grammars): a run of letters can be split into nested words anywhere,
 * so the number of distinct parse stacks grows exponentially with the output. The matcher merges stacks with the
 * same top (constraint_pda.h): the answers are those reasoned by hand below, masks equal the brute force, and the
 * work stays polynomial: a bound on interned stack nodes (a matcher with one parent per node interned up to
 * 189,091 nodes on 64-byte walks of the first grammar and ran for seconds; this one stays near 1,000). */
static void test_ambiguous_recursion(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    const int V = dsv4_cvocab_size(v);
    const char *nested = "root ::= word (root \" \" word){0,3} \".\"\nword ::= [a-z]+\n";
    dsv4_grammar *g = gbnf(nested);
    /* "ab. c." = word "a", then (root "b." " " word "c"), then "."; "abc. d. e." nests once more */
    const tcase t[] = { {"a.", 1}, {"ab. c.", 1}, {"abc. d. e.", 1}, {"a b.", 0}, {"a. b.", 0}, {"ab c.", 0},
                        {"abcdefghij.", 1}, {NULL, 0} };
    for (const tcase *c = t; c->text; c++)
        if (accepts(g, v, c->text) != c->ok) fail_msg("'%s' expected %d", c->text, c->ok);
    const char *wide = "root ::= . root{0,4} r0?\nr0 ::= [a-z] .* | r1 | [ab ]\nr1 ::= \"ab\" | \" \\\"\" | \"x\" \"xb\"\n";
    dsv4_grammar *g2 = gbnf(wide);
    uint64_t *bits = malloc(sizeof *bits * (size_t)((V + 63) / 64));
    int32_t *allowed = malloc(sizeof *allowed * (size_t)V);
    const dsv4_grammar *gs[2] = { g, g2 };
    for (int k = 0; k < 2; k++)
        for (int seed = 0; seed < 4; seed++) {
            uint64_t rng = (uint64_t)seed * 104729 + 17;
            dsv4_cstate *s;
            dsv4_error err;
            assert_int_equal(dsv4_cstate_new(gs[k], v, k ? 40 : 64, &s, &err), 0);
            while (!dsv4_cstate_finished(s)) {
                /* the brute force on one walk per grammar (it costs a walk per token) */
                if (seed == 0) check_mask(s, v, bits);
                else assert_int_equal(dsv4_cstate_allowed(s, bits, &err), 0);
                int n = 0;
                for (int32_t id = 0; id < V; id++)
                    if ((bits[id >> 6] >> (id & 63)) & 1) allowed[n++] = id;
                assert_true(n > 0);
                assert_int_equal(dsv4_cstate_advance(s, allowed[rng_next(&rng) % (uint64_t)n], &err), 0);
            }
            dsv4_cstate_stats st;
            dsv4_cstate_get_stats(s, &st);
            if (st.stack_nodes > 20000) fail_msg("grammar %d seed %d: %lld stack nodes", k, seed, (long long)st.stack_nodes);
            dsv4_cstate_free(s);
        }
    free(allowed);
    free(bits);
    dsv4_grammar_free(g2);
    dsv4_grammar_free(g);
    dsv4_cvocab_free(v);
}

/* A shared matcher gives every state the same answers as a private one, while other states on it walk
 * elsewhere and fill its caches (budget bounds differ per state too). */
static void test_shared_matcher(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    const int V = dsv4_cvocab_size(v), W = (V + 63) / 64;
    uint64_t *a = malloc(sizeof *a * (size_t)W), *b = malloc(sizeof *b * (size_t)W), *o = malloc(sizeof *o * (size_t)W);
    int32_t *allowed = malloc(sizeof *allowed * (size_t)V);
    dsv4_error err;
    for (int si = 0; WALK_SCHEMAS[si]; si++) {
        dsv4_grammar *g = schema_grammar(WALK_SCHEMAS[si], 2);
        dsv4_cmatcher *m;
        assert_int_equal(dsv4_cmatcher_new(g, v, &m, &err), 0);
        for (int seed = 0; seed < 6; seed++) {
            dsv4_cstate *sa, *sb, *other;
            assert_int_equal(dsv4_cstate_new_shared(m, 150, &sa, &err), 0);
            assert_int_equal(dsv4_cstate_new(g, v, 150, &sb, &err), 0);
            assert_int_equal(dsv4_cstate_new_shared(m, 60 + seed, &other, &err), 0);
            assert_ptr_equal(dsv4_cstate_matcher(sa), m);
            uint64_t rng = (uint64_t)seed * 101 + (uint64_t)si, rng2 = rng ^ 0xabcdef;
            while (!dsv4_cstate_finished(sa)) {
                assert_int_equal(dsv4_cstate_allowed(sa, a, &err), 0);
                assert_int_equal(dsv4_cstate_allowed(sb, b, &err), 0);
                assert_memory_equal(a, b, sizeof *a * (size_t)W);
                int na = 0;
                for (int32_t id = 0; id < V; id++)
                    if ((a[id >> 6] >> (id & 63)) & 1) allowed[na++] = id;
                const int32_t tok = allowed[rng_next(&rng) % (uint64_t)na];
                assert_int_equal(dsv4_cstate_advance(sa, tok, &err), 0);
                assert_int_equal(dsv4_cstate_advance(sb, tok, &err), 0);
                if (!dsv4_cstate_finished(other)) {
                    assert_int_equal(dsv4_cstate_allowed(other, o, &err), 0);
                    int no = 0;
                    for (int32_t id = 0; id < V; id++)
                        if ((o[id >> 6] >> (id & 63)) & 1) allowed[no++] = id;
                    assert_int_equal(dsv4_cstate_advance(other, allowed[rng_next(&rng2) % (uint64_t)no], &err), 0);
                }
            }
            dsv4_cstate_free(sa);
            dsv4_cstate_free(sb);
            dsv4_cstate_free(other);
        }
        dsv4_cmatcher_free(m);
        dsv4_grammar_free(g);
    }
    free(a); free(b); free(o); free(allowed);
    dsv4_cvocab_free(v);
}

/* A larger vocabulary of random multi-byte tokens over JSON's alphabet (quotes, escapes, brackets, digits,
 * UTF-8 pieces): many tokens cross the end of a string or a number, so the context-independent walks leave many
 * "uncertain" tokens to the exact check. The mask must still equal every token's own answer at every step, in
 * strings of several properties (the shared walk) and near the end of the budget. */
static void test_mask_large_vocab(void **state) {
    (void)state;
    static const char alpha[] = "ab \"\\{}[]:,0123456789.-eE\ntrufalsn\xc3\xa9\xe6\x97\xa5";
    enum { V = 4000 };
    static char pool[V * 8];
    const char *bytes[V];
    size_t lens[V];
    uint64_t rng = 12345;
    size_t at = 0;
    for (int i = 0; i < V; i++) {
        if (i < 256) { pool[at] = (char)i; bytes[i] = pool + at; lens[i] = 1; at++; continue; }
        const size_t n = 2 + rng_next(&rng) % 6;
        bytes[i] = pool + at;
        for (size_t k = 0; k < n; k++) pool[at++] = alpha[rng_next(&rng) % (sizeof alpha - 1)];
        lens[i] = n;
    }
    bytes[300] = NULL; /* a special token */
    lens[300] = 0;
    dsv4_cvocab *v;
    dsv4_error err;
    assert_int_equal(dsv4_cvocab_new(bytes, lens, V, 299, &v, &err), 0);
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
        "\"c\":{\"type\":\"number\"},\"d\":{\"type\":\"string\",\"maxLength\":5}},\"required\":[\"a\",\"b\",\"c\"]}",
        "true", NULL };
    uint64_t bits[(V + 63) / 64];
    int32_t allowed[V];
    for (int si = 0; schemas[si]; si++) {
        dsv4_grammar *g = schema_grammar(schemas[si], 1);
        for (int seed = 0; seed < 6; seed++) {
            dsv4_cstate *s;
            assert_int_equal(dsv4_cstate_new(g, v, 120, &s, &err), 0);
            uint64_t r2 = (uint64_t)seed * 31 + 7;
            for (int step = 0; step < 130 && !dsv4_cstate_finished(s); step++) {
                check_mask(s, v, bits);
                int na = 0;
                for (int32_t id = 0; id < V; id++)
                    if ((bits[id >> 6] >> (id & 63)) & 1) allowed[na++] = id;
                assert_true(na > 0);
                assert_false((bits[300 >> 6] >> (300 & 63)) & 1);
                assert_int_equal(dsv4_cstate_advance(s, allowed[rng_next(&r2) % (uint64_t)na], &err), 0);
            }
            assert_true(dsv4_cstate_finished(s));
            dsv4_cstate_free(s);
        }
        dsv4_grammar_free(g);
    }
    dsv4_cvocab_free(v);
}

/* A budget below the shortest value: only EOS (the output ends incomplete rather than never). */
static void test_budget_too_small(void **state) {
    (void)state;
    dsv4_cvocab *v = make_vocab();
    dsv4_grammar *g = schema_grammar("{\"const\":\"abcdef\"}", 0);
    dsv4_cstate *s;
    dsv4_error err;
    assert_int_equal(dsv4_cstate_new(g, v, 3, &s, &err), 0);
    assert_true(dsv4_cstate_allows(s, EOS));
    assert_false(dsv4_cstate_allows(s, '"'));
    dsv4_cstate_free(s);
    assert_int_equal(dsv4_cstate_new(g, v, 8, &s, &err), 0);
    assert_false(dsv4_cstate_allows(s, EOS));
    assert_true(dsv4_cstate_allows(s, '"'));
    assert_int_not_equal(dsv4_cstate_advance(s, 'x', &err), 0);
    assert_non_null(strstr(err.msg, "does not fit"));
    dsv4_cstate_free(s);
    dsv4_grammar_free(g);
    dsv4_cvocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_objects),
        cmocka_unit_test(test_enum_const),
        cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_integer_ranges),
        cmocka_unit_test(test_combinators_refs),
        cmocka_unit_test(test_json_mode),
        cmocka_unit_test(test_gbnf),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_random_walks),
        cmocka_unit_test(test_budget_too_small),
        cmocka_unit_test(test_mask_large_vocab),
        cmocka_unit_test(test_shared_matcher),
        cmocka_unit_test(test_ambiguous_recursion),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_lt_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
