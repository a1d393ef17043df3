/* See tool_grammar.h. */
#include "engine/tool_grammar.h"
#include "engine/json_schema.h"
#include "engine/reply_grammar.h"
#include "text/chat.h"
#include "util/error.h"
#include <stdio.h>
#include <string.h>

typedef struct {
    gb_builder *b;
    dsv4_error *err;
    int32_t any_char, raw_char, any_json;   /* shared rules, built on first use (-1) */
} tg;

static void lit(gb_seq *q, tg *t, const char *s) { gb_seq_lit(q, t->b, s, strlen(s)); }
static void dsml(gb_seq *q, tg *t) { gb_seq_special(q, t->b, DSV4_DSML_TEXT); }

/* Any text without '<' (raw parameter values: the closing tag cannot appear). */
static int32_t raw_text(tg *t) {
    if (t->raw_char < 0) {
        const gb_range lt[] = { { '<', '<' } };
        t->raw_char = gb_repeat(t->b, gb_class(t->b, lt, 1, 1), 0, -1);
    }
    return t->raw_char;
}

/* Any text at all (reasoning, content before the block). */
static int32_t any_text(tg *t) {
    if (t->any_char < 0) t->any_char = gb_repeat(t->b, gb_class(t->b, NULL, 0, 1), 0, -1);
    return t->any_char;
}

/* "<｜DSML｜parameter name=\"KEY\" string=\"S\">" with KEY a rule (key_rule >= 0) or a literal. */
static void param_open(gb_seq *q, tg *t, const char *key, int32_t key_rule, const char *is_str) {
    lit(q, t, "<");
    dsml(q, t);
    lit(q, t, "parameter name=\"");
    if (key_rule >= 0) gb_seq_ref(q, key_rule);
    else lit(q, t, key);
    lit(q, t, "\" string=\"");
    lit(q, t, is_str);
    lit(q, t, "\">");
}

static void param_close(gb_seq *q, tg *t) {
    lit(q, t, "</");
    dsml(q, t);
    lit(q, t, "parameter>");
}

/* 1 when the property schema is exactly a plain string ({"type": "string"} plus annotations). */
static int plain_string(const json_t *s) {
    if (!json_is_object(s)) return 0;
    const char *type = json_string_value(json_object_get(s, "type"));
    if (!type || strcmp(type, "string")) return 0;
    static const char *const ok[] = { "type", "description", "title", "$comment", "examples", "default" };
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        int known = 0;
        for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) known |= !strcmp(k, ok[i]);
        if (!known) return 0;
    }
    return 1;
}

/* One parameter of a constrained tool: both forms when the schema allows raw text. */
static int32_t param_rule(tg *t, const json_t *root, const char *key, const json_t *schema, const char *where) {
    /* the whitespace bound of `dsv4 generate --json-schema` (a random model cannot loop in whitespace); '<' in
     * strings only as \u003c, so the text of a closing tag can never appear inside a value */
    const dsv4_schema_opts o = { DSV4_SCHEMA_DEFAULT_WS, 1 };
    const int32_t value = dsv4_schema_rule(t->b, root, schema, &o, where, t->err);
    if (value < 0) return -1;
    const int32_t r = gb_rule(t->b, NULL);
    gb_seq q;
    gb_seq_init(&q);
    param_open(&q, t, key, -1, "false");
    gb_seq_ref(&q, value);
    param_close(&q, t);
    gb_add_alt(t->b, r, &q);
    if (plain_string(schema)) {
        gb_seq_clear(&q);
        param_open(&q, t, key, -1, "true");
        gb_seq_ref(&q, raw_text(t));
        param_close(&q, t);
        gb_add_alt(t->b, r, &q);
    }
    gb_seq_free(&q);
    return r;
}

/* Parameters of a tool whose arguments are not constrained: any names (no quote, '<' or newline), any values. */
static int32_t free_params(tg *t) {
    gb_builder *b = t->b;
    const gb_range bad[] = { { '"', '"' }, { '<', '<' }, { '\n', '\n' } };
    const int32_t key = gb_repeat(b, gb_class(b, bad, 3, 1), 1, -1);
    const dsv4_schema_opts o = { DSV4_SCHEMA_DEFAULT_WS, 1 };
    if (t->any_json < 0 && (t->any_json = dsv4_schema_rule(b, NULL, NULL, &o, NULL, t->err)) < 0) return -1;
    const int32_t one = gb_rule(b, NULL);
    gb_seq q;
    gb_seq_init(&q);
    param_open(&q, t, NULL, key, "false");
    gb_seq_ref(&q, t->any_json);
    param_close(&q, t);
    gb_add_alt(b, one, &q);
    gb_seq_clear(&q);
    param_open(&q, t, NULL, key, "true");
    gb_seq_ref(&q, raw_text(t));
    param_close(&q, t);
    gb_add_alt(b, one, &q);
    /* (one ("\n" one)*)? */
    gb_seq_clear(&q);
    lit(&q, t, "\n");
    gb_seq_ref(&q, one);
    const int32_t more = gb_repeat(b, gb_rule_of(b, &q), 0, -1);
    gb_seq_clear(&q);
    gb_seq_ref(&q, one);
    gb_seq_ref(&q, more);
    const int32_t some = gb_rule_of(b, &q);
    gb_seq_free(&q);
    return gb_repeat(b, some, 0, 1);
}

/* The properties of a constrained tool in schema order, joined by "\n": F_i (nothing written yet) and S_i
 * (something written) for i = n .. 0, optional properties skippable. Returns F_0. */
static int32_t schema_params(tg *t, const json_t *params, const char *tool) {
    gb_builder *b = t->b;
    const json_t *props = json_object_get(params, "properties");
    const json_t *req = json_object_get(params, "required");
    const size_t n = json_is_object(props) ? json_object_size(props) : 0;
    gb_seq q;
    gb_seq_init(&q);
    int32_t f = gb_rule_of(b, &q), s = gb_rule_of(b, &q); /* F_n = S_n = "" */
    /* jansson keeps insertion order; walk it backwards through an index */
    const char **keys = n ? malloc(sizeof *keys * n) : NULL;
    if (n && !keys) {
        gb_seq_free(&q);
        dsv4_fail(t->err, DSV4_E_NOMEM, "out of memory");
        return -1;
    }
    size_t k = 0;
    const char *key;
    json_t *v;
    if (n) json_object_foreach((json_t *)props, key, v) keys[k++] = key;
    for (size_t i = n; i-- > 0;) {
        int required = 0;
        for (size_t j = 0; j < json_array_size(req); j++)
            required |= json_is_string(json_array_get(req, j)) && !strcmp(json_string_value(json_array_get(req, j)), keys[i]);
        if (strpbrk(keys[i], "\"<\n")) {
            dsv4_fail(t->err, DSV4_E_ARG, "tool '%s': parameter name '%.60s' cannot be written in DSML (quote, '<' or newline)",
                      tool, keys[i]);   /* before keys is freed: the message reads keys[i] */
            free(keys);
            gb_seq_free(&q);
            return -1;
        }
        char where[300];
        snprintf(where, sizeof where, "tool '%.80s' #/properties/%.120s", tool, keys[i]);
        const int32_t p = param_rule(t, params, keys[i], json_object_get(props, keys[i]), where);
        if (p < 0) { free(keys); gb_seq_free(&q); return -1; }
        const int32_t f2 = gb_rule(b, NULL), s2 = gb_rule(b, NULL);
        gb_seq_clear(&q);
        gb_seq_ref(&q, p);
        gb_seq_ref(&q, s);
        gb_add_alt(b, f2, &q);
        gb_seq_clear(&q);
        lit(&q, t, "\n");
        gb_seq_ref(&q, p);
        gb_seq_ref(&q, s);
        gb_add_alt(b, s2, &q);
        if (!required) {
            gb_seq_clear(&q);
            gb_seq_ref(&q, f);
            gb_add_alt(b, f2, &q);
            gb_seq_clear(&q);
            gb_seq_ref(&q, s);
            gb_add_alt(b, s2, &q);
        }
        f = f2;
        s = s2;
    }
    free(keys);
    gb_seq_free(&q);
    return f;
}

/* One invoke of tool `fn` (its "function" object). */
static int32_t invoke_rule(tg *t, const json_t *fn, int constrained) {
    const char *name = json_string_value(json_object_get(fn, "name"));
    if (!name || !*name || strpbrk(name, "\"<\n"))
        return dsv4_fail(t->err, DSV4_E_ARG, "tool name '%.60s' cannot be written in DSML (empty, quote, '<' or newline)",
                         name ? name : ""), -1;
    const json_t *params = json_object_get(fn, "parameters");
    if (constrained && params && !json_is_object(params))
        return dsv4_fail(t->err, DSV4_E_ARG, "tool '%s': parameters must be a JSON Schema object", name), -1;
    const int32_t body = constrained ? schema_params(t, params, name) : free_params(t);
    if (body < 0) return -1;
    gb_seq q;
    gb_seq_init(&q);
    lit(&q, t, "<");
    dsml(&q, t);
    lit(&q, t, "invoke name=\"");
    lit(&q, t, name);
    lit(&q, t, "\">\n");
    gb_seq_ref(&q, body);
    lit(&q, t, "\n</");
    dsml(&q, t);
    lit(&q, t, "invoke>");
    const int32_t r = gb_rule_of(t->b, &q);
    gb_seq_free(&q);
    return r;
}

int dsv4_grammar_tool_calls(const json_t *tools, dsv4_tools_mode mode, const char *named, int thinking,
                            dsv4_grammar **out, dsv4_error *err) {
    *out = NULL;
    if (!json_is_array(tools) || json_array_size(tools) == 0) return dsv4_fail(err, DSV4_E_ARG, "tool calls: no tools");
    tg t = { gb_new(), err, -1, -1, -1 };
    if (!t.b) return dsv4_fail(err, DSV4_E_NOMEM, "tool calls: out of memory");
    gb_builder *b = t.b;
    const int32_t invoke = gb_rule(b, "invoke");
    int found = 0;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (mode == DSV4_TOOLS_NAMED && (!name || strcmp(name, named))) continue;
        const int constrained = mode != DSV4_TOOLS_AUTO || json_is_true(json_object_get(fn, "strict"));
        const int32_t r = invoke_rule(&t, fn, constrained);
        if (r < 0) { gb_free(b); return err->code ? err->code : DSV4_E_ARG; }
        gb_seq q;
        gb_seq_init(&q);
        gb_seq_ref(&q, r);
        gb_add_alt(b, invoke, &q);
        gb_seq_free(&q);
        found = 1;
        if (mode == DSV4_TOOLS_NAMED) break;
    }
    if (!found) {
        gb_free(b);
        return dsv4_fail(err, DSV4_E_ARG, "tool calls: no tool named '%.80s'", named ? named : "");
    }
    gb_seq q;
    gb_seq_init(&q);
    /* block: one invoke (named) or invoke ("\n" invoke)* */
    lit(&q, &t, "\n\n<");
    dsml(&q, &t);
    lit(&q, &t, "tool_calls>\n");
    gb_seq_ref(&q, invoke);
    if (mode != DSV4_TOOLS_NAMED) {
        gb_seq more;
        gb_seq_init(&more);
        lit(&more, &t, "\n");
        gb_seq_ref(&more, invoke);
        gb_seq_ref(&q, gb_repeat(b, gb_rule_of(b, &more), 0, -1));
        gb_seq_free(&more);
    }
    lit(&q, &t, "\n</");
    dsml(&q, &t);
    lit(&q, &t, "tool_calls>");
    const int32_t block = gb_rule_of(b, &q);
    gb_seq_clear(&q);
    const int32_t root = gb_rule(b, "reply");
    if (thinking) {
        /* reasoning that never spells "</think>" (reply_grammar.h): the server splits the reply at that text */
        gb_seq_ref(&q, dsv4_reasoning_rule(b));
        gb_seq_special(&q, b, DSV4_THINK_END_TEXT);
    }
    if (mode == DSV4_TOOLS_AUTO) gb_seq_ref(&q, any_text(&t));
    gb_seq_ref(&q, block);
    gb_add_alt(b, root, &q);
    if (mode == DSV4_TOOLS_AUTO) {
        q.n -= 1; /* the same without the block */
        gb_add_alt(b, root, &q);
    }
    gb_seq_free(&q);
    const int rc = gb_finish(b, root, out, err);
    if (rc) dsv4_wrap(err, "tool calls");
    return rc;
}
