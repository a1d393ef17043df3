/* See constraint_hook.h. */
#include "server/constraint_hook.h"
#include "engine/reply_grammar.h"
#include "engine/tool_grammar.h"
#include <stdio.h>
#include <string.h>

int server_constraint_compile(server_constraint_kind kind, const json_t *spec, const char *param, int thinking,
                              dsv4_grammar **out, server_error *e) {
    *out = NULL;
    const char *type = json_string_value(json_object_get(spec, "type"));
    dsv4_error err = {0};
    /* the default whitespace bound, as `dsv4 generate --json-schema` uses it; in thinking mode the reasoning
     * comes first, free, and the value follows the end-of-thinking token (engine/reply_grammar.h) */
    if (kind == SERVER_CONSTRAINT_RESPONSE_FORMAT && type && !strcmp(type, "json_object")) {
        /* OpenAI's JSON mode promises an object, not any JSON value: {"type": "object"} allows every key and value */
        json_t *object = json_pack("{s:s}", "type", "object");
        const int rc = object ? dsv4_grammar_json_reply(object, NULL, thinking, out, &err) : -1;
        json_decref(object);
        if (rc) return server_fail(e, 500, "server_error", param, "JSON mode could not be built: %s", object ? err.msg : "out of memory");
        return 0;
    }
    /* the schema: response_format.json_schema.schema (OpenAI), or {"type": "json_schema", "schema"} (Anthropic's
     * output_config.format) */
    const json_t *schema;
    char where[96];
    if (kind == SERVER_CONSTRAINT_OUTPUT_FORMAT) {
        if (!type || strcmp(type, "json_schema")) {
            snprintf(where, sizeof where, "%s.type", param);
            return server_fail(e, 400, "invalid_request_error", where, "%s: must be \"json_schema\"", where);
        }
        schema = json_object_get(spec, "schema");
        snprintf(where, sizeof where, "%s.schema", param);
    } else {
        const json_t *js = json_object_get(spec, "json_schema");
        if (!json_is_object(js)) {
            snprintf(where, sizeof where, "%s.json_schema", param);
            return server_fail(e, 400, "invalid_request_error", where, "%s: must be an object", where);
        }
        schema = json_object_get(js, "schema");
        snprintf(where, sizeof where, "%s.json_schema.schema", param);
    }
    if (!json_is_object(schema)) return server_fail(e, 400, "invalid_request_error", where, "%s: must be a JSON Schema object", where);
    if (dsv4_grammar_json_reply(schema, NULL, thinking, out, &err))
        return server_fail(e, 400, "invalid_request_error", where, "%s: %s", where, err.msg);
    return 0;
}

int server_constraint_check(server_constraint_kind kind, const json_t *spec, const char *param, server_error *e) {
    dsv4_grammar *g = NULL;
    const int rc = server_constraint_compile(kind, spec, param, 0, &g, e);
    dsv4_grammar_free(g);
    return rc;
}

int server_constraint_tools(const server_request *r, dsv4_grammar **out, server_error *e) {
    dsv4_grammar *g = NULL;
    dsv4_error err = {0};
    if (out) *out = NULL;
    if (dsv4_grammar_tool_calls(r->tools, (dsv4_tools_mode)r->tool_mode, r->tool_name, r->thinking, &g, &err))
        return server_fail(e, 400, "invalid_request_error", r->tool_mode == DSV4_TOOLS_AUTO ? "tools" : "tool_choice",
                           "%s: %s", r->tool_mode == DSV4_TOOLS_AUTO ? "tools" : "tool_choice", err.msg);
    if (out) *out = g;
    else dsv4_grammar_free(g);
    return 0;
}
