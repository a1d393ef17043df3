/* See constraint_hook.h. */
#include "server/constraint_hook.h"
#include "engine/json_schema.h"
#include "engine/tool_grammar.h"
#include <string.h>

int server_constraint_compile(server_constraint_kind kind, const json_t *spec, const char *param, dsv4_grammar **out,
                              server_error *e) {
    *out = NULL;
    (void)kind;
    const char *type = json_string_value(json_object_get(spec, "type"));
    dsv4_error err = {0};
    /* the default whitespace bound, as `dsv4 generate --json-schema` uses it */
    if (type && !strcmp(type, "json_object")) {
        if (dsv4_grammar_json_any(NULL, out, &err))
            return server_fail(e, 500, "server_error", param, "JSON mode could not be built: %s", err.msg);
        return 0;
    }
    const json_t *js = json_object_get(spec, "json_schema");
    const json_t *schema = json_object_get(js, "schema");
    if (!json_is_object(js)) return server_fail(e, 400, "invalid_request_error", "response_format.json_schema",
                                                "response_format.json_schema: must be an object");
    if (!json_is_object(schema)) return server_fail(e, 400, "invalid_request_error", "response_format.json_schema.schema",
                                                    "response_format.json_schema.schema: must be a JSON Schema object");
    if (dsv4_grammar_from_schema(schema, NULL, out, &err))
        return server_fail(e, 400, "invalid_request_error", "response_format.json_schema.schema",
                           "response_format.json_schema.schema: %s", err.msg);
    return 0;
}

int server_constraint_check(server_constraint_kind kind, const json_t *spec, const char *param, server_error *e) {
    dsv4_grammar *g = NULL;
    const int rc = server_constraint_compile(kind, spec, param, &g, e);
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
