/* Request parsing and validation: see request.h. Every check names the JSON field it is about, with the
 * path the client sent (messages[2].content[0].text), so an error points at the byte the client must fix. */
#include "server/request.h"
#include "server/constraint_hook.h"
#include "engine/tool_grammar.h"
#include "text/chat.h"
#include "text/strbuf.h"
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Messages and field names quote the request (a role, a key), which may hold line breaks; an error is one
 * line, so control characters but tab become spaces (tests/fuzz/fuzz_server_request.c found a role with a
 * newline; util/error.c does the same for the engine's messages). */
static void one_line(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 && *s != '\t') *s = ' ';
}

int server_fail(server_error *e, int status, const char *type, const char *param, const char *fmt, ...) {
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    one_line(e->param);
    one_line(e->message);
    return status;
}

static const char *INVALID = "invalid_request_error";

static int bad(server_error *e, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(server_error *e, const char *param, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return server_fail(e, 400, INVALID, param, "%s: %s", param, msg);
}

/* ---- typed field readers: absent or null = not given (returns 0 with *given = 0) ------------------------ */

static int get_number(const json_t *o, const char *key, double lo, double hi, double *out, int *given, server_error *e) {
    json_t *v = json_object_get(o, key);
    if (given) *given = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return bad(e, key, "must be a number");
    const double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return bad(e, key, "must be in [%g, %g], got %g", lo, hi, x);
    *out = x;
    if (given) *given = 1;
    return 0;
}

static int get_int(const json_t *o, const char *key, long long lo, long long hi, long long *out, int *given,
                   server_error *e) {
    json_t *v = json_object_get(o, key);
    if (given) *given = 0;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return bad(e, key, "must be an integer");
    const long long x = json_integer_value(v);
    if (x < lo || x > hi) return bad(e, key, "must be in [%lld, %lld], got %lld", lo, hi, x);
    *out = x;
    if (given) *given = 1;
    return 0;
}

static int get_bool(const json_t *o, const char *key, int *out, server_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad(e, key, "must be a boolean");
    *out = json_is_true(v);
    return 0;
}

static int get_string(const json_t *o, const char *key, const char **out, server_error *e) {
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return bad(e, key, "must be a string");
    *out = json_string_value(v);
    return 0;
}

/* ---- common parameters ------------------------------------------------------------------------------- */

static int parse_model(const json_t *root, const server_parse_limits *lim, int required, server_request *r, server_error *e) {
    const char *model;
    if (get_string(root, "model", &model, e)) return e->status;
    if (!model) return required ? bad(e, "model", "is required") : 0;
    if (lim->served_model && *lim->served_model && strcmp(model, lim->served_model))
        return server_fail(e, 404, "not_found_error", "model", "model '%.200s' does not exist; this server serves '%.200s'",
                           model, lim->served_model);
    r->model = strdup(model);
    return r->model ? 0 : server_fail(e, 500, "server_error", "", "out of memory");
}

/* temperature, top_p, top_k, min_p, seed. max_temp: 2 (OpenAI) or 1 (Anthropic). */
static int parse_sampling(const json_t *root, double max_temp, server_request *r, server_error *e) {
    double t = 1.0, p = 1.0, mp = 0.0;
    int given_t = 0;
    long long k = 0, seed = 0;
    if (get_number(root, "temperature", 0.0, max_temp, &t, &given_t, e)) return e->status;
    if (get_number(root, "top_p", 0.0, 1.0, &p, NULL, e)) return e->status;
    if (!(p > 0.0)) return bad(e, "top_p", "must be > 0");
    if (get_int(root, "top_k", -1, 1 << 30, &k, NULL, e)) return e->status;
    if (get_number(root, "min_p", 0.0, 1.0, &mp, NULL, e)) return e->status;
    if (mp >= 1.0) return bad(e, "min_p", "must be < 1");
    if (get_int(root, "seed", -(1LL << 62), 1LL << 62, &seed, &r->seed_given, e)) return e->status;
    /* a missing temperature means the API default (1); 0 is greedy */
    r->sampling.temperature = (float)t;
    r->sampling.top_p = (float)p;
    r->sampling.top_k = k < 0 ? 0 : (int)k;
    r->sampling.min_p = (float)mp;
    r->sampling.seed = (uint64_t)seed;
    return 0;
}

/* stop: a string or an array of strings (OpenAI), stop_sequences: an array (Anthropic). */
static int parse_stop(const json_t *root, const char *key, int allow_string, const server_parse_limits *lim,
                      server_request *r, server_error *e) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    json_t *arr = v;
    int own = 0;
    if (json_is_string(v) && allow_string) {
        arr = json_array();
        json_array_append(arr, v);
        own = 1;
    } else if (!json_is_array(v)) {
        return bad(e, key, allow_string ? "must be a string or an array of strings" : "must be an array of strings");
    }
    int rc = 0;
    const size_t n = json_array_size(arr);
    if ((int)n > lim->max_stop) rc = bad(e, key, "at most %d stop sequences, got %zu", lim->max_stop, n);
    if (!rc && n) {
        r->stop = calloc(n, sizeof *r->stop);
        if (!r->stop) rc = server_fail(e, 500, "server_error", "", "out of memory");
    }
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *s = json_array_get(arr, i);
        char param[64];
        snprintf(param, sizeof param, "%s[%zu]", key, i);
        if (!json_is_string(s)) rc = bad(e, param, "must be a string");
        else if (json_string_length(s) == 0) rc = bad(e, param, "must not be empty");
        else if (!(r->stop[r->n_stop++] = strdup(json_string_value(s)))) rc = server_fail(e, 500, "server_error", "", "out of memory");
    }
    if (own) json_decref(arr);
    return rc;
}

/* ---- OpenAI chat messages -> the renderer's message list ---------------------------------------------- */

/* Text of a content value: a string, or an array of {"type": "text", "text": ...} parts (joined). */
static int content_to_text(const json_t *c, const char *param, int allow_null, dsv4_strbuf *out, server_error *e) {
    if (!c || json_is_null(c)) return allow_null ? 0 : bad(e, param, "is required");
    if (json_is_string(c)) { dsv4_sb_append(out, json_string_value(c), json_string_length(c)); return 0; }
    if (!json_is_array(c)) return bad(e, param, "must be a string or an array of content parts");
    size_t i;
    json_t *part;
    json_array_foreach(c, i, part) {
        char p[160];
        snprintf(p, sizeof p, "%s[%zu]", param, i);
        if (!json_is_object(part)) return bad(e, p, "must be an object");
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!type) return bad(e, p, "needs a string \"type\"");
        if (strcmp(type, "text")) return bad(e, p, "content parts of type '%.40s' are not supported (text only)", type);
        json_t *t = json_object_get(part, "text");
        if (!json_is_string(t)) return bad(e, p, "a text part needs a string \"text\"");
        dsv4_sb_append(out, json_string_value(t), json_string_length(t));
    }
    return 0;
}

static json_t *text_value(dsv4_strbuf *b) {
    size_t n = 0;
    char *s = dsv4_sb_take(b, &n);
    json_t *v = s ? json_stringn(s, n) : NULL;
    free(s);
    return v;
}

/* Check one function tool {"type": "function", "function": {"name", "description"?, "parameters"?}}. */
static int check_tool(const json_t *t, size_t i, server_error *e) {
    char p[96];
    snprintf(p, sizeof p, "tools[%zu]", i);
    if (!json_is_object(t)) return bad(e, p, "must be an object");
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!type || strcmp(type, "function")) return bad(e, p, "\"type\" must be \"function\"");
    json_t *fn = json_object_get(t, "function");
    snprintf(p, sizeof p, "tools[%zu].function", i);
    if (!json_is_object(fn)) return bad(e, p, "must be an object");
    json_t *name = json_object_get(fn, "name");
    snprintf(p, sizeof p, "tools[%zu].function.name", i);
    if (!json_is_string(name) || json_string_length(name) == 0) return bad(e, p, "must be a non-empty string");
    json_t *d = json_object_get(fn, "description");
    snprintf(p, sizeof p, "tools[%zu].function.description", i);
    if (d && !json_is_null(d) && !json_is_string(d)) return bad(e, p, "must be a string");
    json_t *params = json_object_get(fn, "parameters");
    snprintf(p, sizeof p, "tools[%zu].function.parameters", i);
    if (params && !json_is_null(params) && !json_is_object(params)) return bad(e, p, "must be a JSON Schema object");
    return 0;
}

static int check_tools(const json_t *tools, server_error *e) {
    if (!json_is_array(tools)) return bad(e, "tools", "must be an array");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) if (check_tool(t, i, e)) return e->status;
    return 0;
}

/* An assistant's tool_calls: [{"id", "type": "function", "function": {"name", "arguments": string}}]. */
static int normalize_tool_calls(const json_t *calls, int mi, json_t *msg, server_error *e) {
    char p[128];
    snprintf(p, sizeof p, "messages[%d].tool_calls", mi);
    if (!json_is_array(calls)) return bad(e, p, "must be an array");
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        snprintf(p, sizeof p, "messages[%d].tool_calls[%zu]", mi, i);
        json_t *fn = json_is_object(c) ? json_object_get(c, "function") : NULL;
        json_t *id = json_is_object(c) ? json_object_get(c, "id") : NULL;
        if (!json_is_object(fn)) { json_decref(out); return bad(e, p, "needs a \"function\" object"); }
        if (id && !json_is_null(id) && !json_is_string(id)) { json_decref(out); return bad(e, p, "\"id\" must be a string"); }
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        if (!json_is_string(name)) { json_decref(out); return bad(e, p, "function.name must be a string"); }
        if (args && !json_is_string(args)) { json_decref(out); return bad(e, p, "function.arguments must be a string"); }
        json_array_append_new(out, json_pack("{s:O?, s:{s:O, s:O?}}", "id", id, "function", "name", name, "arguments",
                                             args ? args : NULL));
    }
    json_object_set_new(msg, "tool_calls", out);
    return 0;
}

static int normalize_openai_messages(const json_t *msgs, json_t *out, server_error *e) {
    if (!msgs) return bad(e, "messages", "is required");
    if (!json_is_array(msgs)) return bad(e, "messages", "must be an array");
    if (json_array_size(msgs) == 0) return bad(e, "messages", "must contain at least one message");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        char p[128];
        const int mi = (int)i;
        snprintf(p, sizeof p, "messages[%d]", mi);
        if (!json_is_object(m)) return bad(e, p, "must be an object");
        snprintf(p, sizeof p, "messages[%d].role", mi);
        json_t *rv = json_object_get(m, "role");
        if (!json_is_string(rv)) return bad(e, p, "must be a string");
        const char *role = json_string_value(rv);
        const int is_asst = !strcmp(role, "assistant"), is_tool = !strcmp(role, "tool");
        if (strcmp(role, "system") && strcmp(role, "developer") && strcmp(role, "user") && !is_asst && !is_tool)
            return bad(e, p, "unknown role '%.40s' (system, developer, user, assistant or tool)", role);
        json_t *nm = json_pack("{s:s}", "role", role);
        dsv4_strbuf text;
        dsv4_sb_init(&text);
        snprintf(p, sizeof p, "messages[%d].content", mi);
        json_t *calls = json_object_get(m, "tool_calls");
        const int has_calls = is_asst && calls && !json_is_null(calls);
        if (content_to_text(json_object_get(m, "content"), p, is_asst, &text, e)) {
            dsv4_sb_free(&text);
            json_decref(nm);
            return e->status;
        }
        json_object_set_new(nm, "content", text_value(&text));
        if (is_asst) {
            json_t *rc = json_object_get(m, "reasoning_content");
            snprintf(p, sizeof p, "messages[%d].reasoning_content", mi);
            if (rc && !json_is_null(rc)) {
                if (!json_is_string(rc)) { json_decref(nm); return bad(e, p, "must be a string"); }
                json_object_set(nm, "reasoning_content", rc);
            }
            if (has_calls && normalize_tool_calls(calls, mi, nm, e)) { json_decref(nm); return e->status; }
        } else if (calls && !json_is_null(calls)) {
            snprintf(p, sizeof p, "messages[%d].tool_calls", mi);
            json_decref(nm);
            return bad(e, p, "only assistant messages may carry tool calls");
        }
        if (is_tool) {
            json_t *id = json_object_get(m, "tool_call_id");
            snprintf(p, sizeof p, "messages[%d].tool_call_id", mi);
            if (!json_is_string(id)) { json_decref(nm); return bad(e, p, "a tool message needs a string tool_call_id"); }
            json_object_set(nm, "tool_call_id", id);
        }
        json_array_append_new(out, nm);
    }
    return 0;
}

/* ---- thinking: OpenAI reasoning_effort / thinking, Anthropic thinking --------------------------------- */

typedef struct {
    int thinking;
    const char *effort;          /* NULL or an effort the encoder knows */
} think_choice;

static int parse_effort(const char *s, int enc_0731, think_choice *tc, server_error *e) {
    if (!strcmp(s, "none")) { tc->thinking = 0; return 0; }
    tc->thinking = 1;
    if (!strcmp(s, "minimal") || !strcmp(s, "low") || !strcmp(s, "medium")) tc->effort = enc_0731 ? "low" : NULL;
    else if (!strcmp(s, "high")) tc->effort = "high";
    else if (!strcmp(s, "max") || !strcmp(s, "xhigh")) tc->effort = "max";
    else return bad(e, "reasoning_effort", "must be one of none, minimal, low, medium, high, max; got '%.40s'", s);
    return 0;
}

/* `thinking`: a boolean, or {"type": "enabled" | "disabled", ...} (DeepSeek's and Anthropic's shape). */
static int parse_thinking_switch(const json_t *root, think_choice *tc, int *given, server_error *e) {
    json_t *v = json_object_get(root, "thinking");
    *given = 0;
    if (!v || json_is_null(v)) return 0;
    *given = 1;
    if (json_is_boolean(v)) { tc->thinking = json_is_true(v); return 0; }
    if (!json_is_object(v)) return bad(e, "thinking", "must be a boolean or {\"type\": \"enabled\" | \"disabled\"}");
    const char *type = json_string_value(json_object_get(v, "type"));
    if (!type) return bad(e, "thinking.type", "must be a string");
    if (!strcmp(type, "enabled")) tc->thinking = 1;
    else if (!strcmp(type, "disabled")) tc->thinking = 0;
    else return bad(e, "thinking.type", "must be \"enabled\" or \"disabled\", got '%.40s'", type);
    json_t *budget = json_object_get(v, "budget_tokens");
    if (budget && !json_is_null(budget) && !json_is_integer(budget)) return bad(e, "thinking.budget_tokens", "must be an integer");
    return 0;
}

/* ---- rendering ----------------------------------------------------------------------------------------- */

static int render(json_t *messages, json_t *tools, json_t *response_format, const think_choice *tc,
                  const server_parse_limits *lim, server_request *r, server_error *e) {
    json_t *req = json_pack("{s:O, s:s, s:s}", "messages", messages, "mode", tc->thinking ? "thinking" : "chat",
                            "encoder", lim->encoder_0731 ? "v4-0731" : "v4");
    if (!req) return server_fail(e, 500, "server_error", "", "out of memory");
    if (tc->thinking && tc->effort) json_object_set_new(req, "effort", json_string(tc->effort));
    if (tools) json_object_set(req, "tools", tools);
    /* the official encoding states the format in the system prompt; the mask enforces it */
    if (response_format) json_object_set(req, "response_format", response_format);
    dsv4_error err = {0};
    size_t len = 0;
    int rc = dsv4_chat_render_request(req, &r->prompt_text, &len, &err);
    json_decref(req);
    if (rc) return server_fail(e, 400, INVALID, "messages", "the conversation cannot be encoded: %s", err.msg);
    /* The output starts with reasoning only when the prompt ends with the opening <think>; a conversation that
     * ends with an assistant message (continued, not answered) does not, even in thinking mode.
     * (tests/fuzz/fuzz_server_request.c, regressions/server_request/thinking-after-assistant-message.) */
    const size_t k = strlen(DSV4_THINK_TEXT);
    r->thinking = tc->thinking && len >= k && !memcmp(r->prompt_text + len - k, DSV4_THINK_TEXT, k);
    return 0;
}

/* tool_choice (OpenAI): "auto" | "none" | "required" | {"type": "function", "function": {"name"}}.
 * Returns through *use_tools whether the tools go into the prompt, and sets the request's tool constraint:
 * required / named always, auto when some tool says "strict": true (constraint_hook.h). */
static int parse_tool_choice_openai(const json_t *root, json_t *tools, int *use_tools, server_request *r,
                                    server_error *e) {
    const int have_tools = tools && json_array_size(tools) > 0;
    json_t *tc = json_object_get(root, "tool_choice");
    *use_tools = have_tools;
    int mode = DSV4_TOOLS_AUTO;
    const char *name = NULL;
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none")) { *use_tools = 0; return 0; }
            if (!strcmp(s, "required")) {
                if (!have_tools) return bad(e, "tool_choice", "\"required\" needs tools");
                mode = DSV4_TOOLS_REQUIRED;
            } else if (strcmp(s, "auto")) {
                return bad(e, "tool_choice", "must be auto, none, required or a function, got '%.40s'", s);
            }
        } else {
            if (!json_is_object(tc)) return bad(e, "tool_choice", "must be a string or an object");
            name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!name) return bad(e, "tool_choice", "a named tool choice needs function.name");
            if (!have_tools) return bad(e, "tool_choice", "names a function but no tools were given");
            mode = DSV4_TOOLS_NAMED;
        }
    }
    if (!have_tools) return 0;
    if (mode == DSV4_TOOLS_AUTO) {
        int strict = 0;
        for (size_t i = 0; i < json_array_size(tools); i++)
            strict |= json_is_true(json_object_get(json_object_get(json_array_get(tools, i), "function"), "strict"));
        if (!strict) return 0;
    }
    r->tool_mode = mode;
    r->tools = json_incref(tools);
    if (name && !(r->tool_name = strdup(name))) return server_fail(e, 500, "server_error", "", "out of memory");
    return 0;
}

/* After rendering (thinking mode is known): the tool constraint compiles, and is the only constraint. */
static int check_tool_constraint(server_request *r, server_error *e) {
    if (r->tool_mode < 0) return 0;
    if (r->response_format)
        return bad(e, r->rf_param, "cannot be enforced together with a forced or strict tool call");
    return server_constraint_tools(r, NULL, e);
}

/* response_format json_object / json_schema: compiled once here to validate it, kept for the jobs. */
static int parse_response_format(const json_t *root, server_request *r, server_error *e) {
    json_t *rf = json_object_get(root, "response_format");
    if (!rf || json_is_null(rf)) return 0;
    if (!json_is_object(rf)) return bad(e, "response_format", "must be an object");
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!type) return bad(e, "response_format.type", "must be a string");
    if (!strcmp(type, "text")) return 0;
    if (strcmp(type, "json_object") && strcmp(type, "json_schema"))
        return bad(e, "response_format.type", "must be text, json_object or json_schema, got '%.40s'", type);
    if (server_constraint_check(SERVER_CONSTRAINT_RESPONSE_FORMAT, rf, "response_format", e)) return e->status;
    r->response_format = json_incref(rf);
    r->rf_kind = SERVER_CONSTRAINT_RESPONSE_FORMAT;
    r->rf_param = "response_format";
    return 0;
}

/* Anthropic structured outputs: output_config.format = {"type": "json_schema", "schema": {...}} (the beta's
 * top-level output_format, the same object, too). The same constraint as response_format; output_config's
 * other member, effort, is a hint this server leaves aside (thinking is chosen by `thinking`). */
static int parse_output_format(const json_t *root, server_request *r, server_error *e) {
    json_t *oc = json_object_get(root, "output_config"), *f = NULL, *beta = json_object_get(root, "output_format");
    const char *param = "output_config.format";
    if (oc && !json_is_null(oc)) {
        if (!json_is_object(oc)) return bad(e, "output_config", "must be an object");
        f = json_object_get(oc, "format");
        if (f && json_is_null(f)) f = NULL;
    }
    if (beta && !json_is_null(beta)) {
        if (f) return bad(e, "output_format", "cannot be given together with output_config.format");
        f = beta;
        param = "output_format";
    }
    if (!f) return 0;
    if (!json_is_object(f)) return bad(e, param, "must be an object");
    if (server_constraint_check(SERVER_CONSTRAINT_OUTPUT_FORMAT, f, param, e)) return e->status;
    r->response_format = json_incref(f);
    r->rf_kind = SERVER_CONSTRAINT_OUTPUT_FORMAT;
    r->rf_param = param;
    return 0;
}

/* Fields a client may send that this server would otherwise silently ignore although they change the output. */
static int refuse_unsupported(const json_t *root, server_error *e) {
    static const char *const keys[] = {"logit_bias", "functions", "function_call", "audio", "modalities", "prediction"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        json_t *v = json_object_get(root, keys[i]);
        if (v && !json_is_null(v)) return bad(e, keys[i], "is not supported by this server");
    }
    return 0;
}

static int parse_penalties(const json_t *root, server_request *r, server_error *e) {
    double pp = 0, fp = 0;
    if (get_number(root, "presence_penalty", -2.0, 2.0, &pp, NULL, e)) return e->status;
    if (get_number(root, "frequency_penalty", -2.0, 2.0, &fp, NULL, e)) return e->status;
    r->presence_penalty = (float)pp;
    r->frequency_penalty = (float)fp;
    return 0;
}

static int parse_stream(const json_t *root, server_request *r, server_error *e) {
    if (get_bool(root, "stream", &r->stream, e)) return e->status;
    json_t *so = json_object_get(root, "stream_options");
    if (!so || json_is_null(so)) return 0;
    if (!json_is_object(so)) return bad(e, "stream_options", "must be an object");
    if (!r->stream) return bad(e, "stream_options", "is only allowed with stream: true");
    json_t *iu = json_object_get(so, "include_usage");
    if (iu && !json_is_null(iu)) {
        if (!json_is_boolean(iu)) return bad(e, "stream_options.include_usage", "must be a boolean");
        r->include_usage = json_is_true(iu);
    }
    return 0;
}

static int parse_chat(const json_t *root, const server_parse_limits *lim, server_request *r, server_error *e) {
    long long n = 1, mt = -1, mct = -1, tl = 0;
    int given_mt = 0, given_mct = 0, given_tl = 0;
    if (parse_model(root, lim, 0, r, e) || refuse_unsupported(root, e) || parse_sampling(root, 2.0, r, e) ||
        parse_penalties(root, r, e) || parse_stream(root, r, e) || parse_stop(root, "stop", 1, lim, r, e))
        return e->status;
    if (get_int(root, "n", 1, lim->max_n, &n, NULL, e)) return e->status;
    if (get_int(root, "max_tokens", 1, 1LL << 40, &mt, &given_mt, e)) return e->status;
    if (get_int(root, "max_completion_tokens", 1, 1LL << 40, &mct, &given_mct, e)) return e->status;
    r->n = (int)n;
    r->max_tokens = given_mct ? mct : given_mt ? mt : -1;
    if (get_bool(root, "logprobs", &r->logprobs, e)) return e->status;
    if (get_bool(root, "return_token_ids", &r->return_token_ids, e)) return e->status;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e)) return e->status;
    if (get_int(root, "top_logprobs", 0, lim->max_top_logprobs, &tl, &given_tl, e)) return e->status;
    if (given_tl && !r->logprobs) return bad(e, "top_logprobs", "needs logprobs: true");
    r->top_logprobs = (int)tl;
    if (parse_response_format(root, r, e)) return e->status;

    think_choice tc = {0, NULL};
    const char *effort;
    int switch_given;
    if (get_string(root, "reasoning_effort", &effort, e)) return e->status;
    if (effort && parse_effort(effort, lim->encoder_0731, &tc, e)) return e->status;
    think_choice sw = tc;
    if (parse_thinking_switch(root, &sw, &switch_given, e)) return e->status;
    if (switch_given) tc.thinking = sw.thinking;

    json_t *tools = json_object_get(root, "tools");
    if (tools && json_is_null(tools)) tools = NULL;
    if (tools && check_tools(tools, e)) return e->status;
    int use_tools = 0;
    if (parse_tool_choice_openai(root, tools, &use_tools, r, e)) return e->status;
    r->parse_tools = use_tools;

    json_t *msgs = json_array();
    int rc = normalize_openai_messages(json_object_get(root, "messages"), msgs, e);
    if (!rc) rc = render(msgs, use_tools ? tools : NULL, r->response_format, &tc, lim, r, e);
    if (!rc) rc = check_tool_constraint(r, e);
    json_decref(msgs);
    return rc;
}

/* ---- Anthropic messages -------------------------------------------------------------------------------- */

/* Anthropic content -> OpenAI messages appended to out. A user turn's tool_result blocks become tool messages
 * (in order, before the user's own text); an assistant's thinking / text / tool_use blocks become one
 * assistant message with reasoning_content, content and tool_calls. */
static int anthropic_message(const json_t *m, int mi, json_t *out, server_error *e) {
    char p[128];
    snprintf(p, sizeof p, "messages[%d]", mi);
    if (!json_is_object(m)) return bad(e, p, "must be an object");
    snprintf(p, sizeof p, "messages[%d].role", mi);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role) return bad(e, p, "must be a string");
    const int asst = !strcmp(role, "assistant");
    if (!asst && strcmp(role, "user")) return bad(e, p, "must be \"user\" or \"assistant\", got '%.40s'", role);
    json_t *c = json_object_get(m, "content");
    snprintf(p, sizeof p, "messages[%d].content", mi);
    if (json_is_string(c)) {
        json_array_append_new(out, json_pack("{s:s, s:O}", "role", role, "content", c));
        return 0;
    }
    if (!json_is_array(c)) return bad(e, p, "must be a string or an array of content blocks");
    dsv4_strbuf text, thinking;
    dsv4_sb_init(&text);
    dsv4_sb_init(&thinking);
    json_t *calls = json_array();
    int rc = 0;
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        snprintf(p, sizeof p, "messages[%d].content[%zu]", mi, i);
        const char *type = json_is_object(b) ? json_string_value(json_object_get(b, "type")) : NULL;
        if (!type) { rc = bad(e, p, "must be an object with a string \"type\""); break; }
        if (!strcmp(type, "text")) {
            json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) { rc = bad(e, p, "a text block needs a string \"text\""); break; }
            dsv4_sb_append(&text, json_string_value(t), json_string_length(t));
        } else if (!strcmp(type, "thinking") && asst) {
            json_t *t = json_object_get(b, "thinking");
            if (!json_is_string(t)) { rc = bad(e, p, "a thinking block needs a string \"thinking\""); break; }
            dsv4_sb_append(&thinking, json_string_value(t), json_string_length(t));
        } else if (!strcmp(type, "redacted_thinking") && asst) {
            /* nothing to render: the text is not ours to read */
        } else if (!strcmp(type, "tool_use") && asst) {
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(name)) { rc = bad(e, p, "a tool_use block needs string id and name"); break; }
            if (!json_is_object(input)) { rc = bad(e, p, "a tool_use block's input must be an object"); break; }
            char *args = json_dumps(input, JSON_COMPACT | JSON_ENSURE_ASCII);
            json_array_append_new(calls, json_pack("{s:O, s:{s:O, s:s}}", "id", id, "function", "name", name, "arguments",
                                                   args ? args : "{}"));
            free(args);
        } else if (!strcmp(type, "tool_result") && !asst) {
            json_t *id = json_object_get(b, "tool_use_id");
            if (!json_is_string(id)) { rc = bad(e, p, "a tool_result block needs a string tool_use_id"); break; }
            dsv4_strbuf tr;
            dsv4_sb_init(&tr);
            char pc[160];
            snprintf(pc, sizeof pc, "messages[%d].content[%zu].content", mi, i);
            json_t *trc = json_object_get(b, "content");
            if (trc && content_to_text(trc, pc, 1, &tr, e)) { dsv4_sb_free(&tr); rc = e->status; break; }
            json_t *is_err = json_object_get(b, "is_error");
            if (json_is_true(is_err)) {
                dsv4_strbuf t2;
                dsv4_sb_init(&t2);
                dsv4_sb_puts(&t2, "Error: ");
                dsv4_sb_append(&t2, tr.data ? tr.data : "", tr.len);
                dsv4_sb_free(&tr);
                tr = t2;
            }
            json_array_append_new(out, json_pack("{s:s, s:o, s:O}", "role", "tool", "content", text_value(&tr),
                                                 "tool_call_id", id));
        } else {
            rc = bad(e, p, "content blocks of type '%.40s' are not supported in %s messages", type, role);
            break;
        }
    }
    if (!rc && (text.len || !asst || json_array_size(calls) || thinking.len)) {
        /* a user message made only of tool results adds no user turn of its own */
        const int only_results = !asst && text.len == 0 && json_array_size(c) > 0;
        if (!only_results) {
            json_t *nm = json_pack("{s:s, s:o}", "role", role, "content", text_value(&text));
            if (asst && thinking.len) json_object_set_new(nm, "reasoning_content", text_value(&thinking));
            if (asst && json_array_size(calls)) json_object_set(nm, "tool_calls", calls);
            json_array_append_new(out, nm);
        }
    }
    dsv4_sb_free(&text);
    dsv4_sb_free(&thinking);
    json_decref(calls);
    return rc;
}

/* Anthropic tools [{"name", "description"?, "input_schema"}] -> OpenAI function tools. */
static int anthropic_tools(const json_t *tools, json_t **out, server_error *e) {
    *out = NULL;
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return bad(e, "tools", "must be an array");
    json_t *o = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char p[96];
        snprintf(p, sizeof p, "tools[%zu]", i);
        json_t *name = json_is_object(t) ? json_object_get(t, "name") : NULL;
        if (!json_is_string(name) || json_string_length(name) == 0) { json_decref(o); return bad(e, p, "needs a non-empty string name"); }
        json_t *schema = json_object_get(t, "input_schema"), *desc = json_object_get(t, "description");
        snprintf(p, sizeof p, "tools[%zu].input_schema", i);
        if (!json_is_object(schema)) { json_decref(o); return bad(e, p, "must be a JSON Schema object"); }
        snprintf(p, sizeof p, "tools[%zu].description", i);
        if (desc && !json_is_null(desc) && !json_is_string(desc)) { json_decref(o); return bad(e, p, "must be a string"); }
        json_t *fn = json_pack("{s:O}", "name", name);
        if (json_is_string(desc)) json_object_set(fn, "description", desc);
        json_object_set(fn, "parameters", schema);
        json_array_append_new(o, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    *out = o;
    return 0;
}

static int parse_messages_api(const json_t *root, const server_parse_limits *lim, server_request *r, server_error *e) {
    long long mt = 0;
    int given_mt = 0;
    if (parse_model(root, lim, 0, r, e) || parse_sampling(root, 1.0, r, e) || parse_stream(root, r, e) ||
        parse_stop(root, "stop_sequences", 0, lim, r, e))
        return e->status;
    if (get_int(root, "max_tokens", 1, 1LL << 40, &mt, &given_mt, e)) return e->status;
    if (!given_mt) return bad(e, "max_tokens", "is required");
    r->max_tokens = mt;
    r->n = 1;
    think_choice tc = {0, NULL};
    int given;
    if (parse_thinking_switch(root, &tc, &given, e)) return e->status;
    if (parse_output_format(root, r, e)) return e->status;

    json_t *tools = NULL;
    if (anthropic_tools(json_object_get(root, "tools"), &tools, e)) return e->status;
    int use_tools = tools && json_array_size(tools) > 0;
    json_t *tch = json_object_get(root, "tool_choice");
    if (tch && !json_is_null(tch)) {
        const char *type = json_is_object(tch) ? json_string_value(json_object_get(tch, "type")) : NULL;
        int rc = 0;
        if (!type) rc = bad(e, "tool_choice", "must be an object with a string \"type\"");
        else if (!strcmp(type, "none")) use_tools = 0;
        else if (!strcmp(type, "any") || !strcmp(type, "tool")) {
            const char *name = json_string_value(json_object_get(tch, "name"));
            if (!use_tools) rc = bad(e, "tool_choice", "\"%s\" needs tools", type);
            else if (!strcmp(type, "tool") && !name) rc = bad(e, "tool_choice.name", "must be a string");
            else {
                r->tool_mode = !strcmp(type, "any") ? DSV4_TOOLS_REQUIRED : DSV4_TOOLS_NAMED;
                r->tools = json_incref(tools);
                if (name && !strcmp(type, "tool") && !(r->tool_name = strdup(name)))
                    rc = server_fail(e, 500, "server_error", "", "out of memory");
            }
        }
        else if (strcmp(type, "auto")) rc = bad(e, "tool_choice.type", "must be auto, any, tool or none, got '%.40s'", type);
        if (rc) { json_decref(tools); return rc; }
    }
    r->parse_tools = use_tools;

    json_t *msgs = json_array();
    int rc = 0;
    json_t *sys = json_object_get(root, "system");
    if (sys && !json_is_null(sys)) {
        dsv4_strbuf st;
        dsv4_sb_init(&st);
        rc = content_to_text(sys, "system", 0, &st, e);
        if (!rc) json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content", text_value(&st)));
        else dsv4_sb_free(&st);
    }
    json_t *in = json_object_get(root, "messages");
    if (!rc && !json_is_array(in)) rc = bad(e, "messages", in ? "must be an array" : "is required");
    if (!rc && json_array_size(in) == 0) rc = bad(e, "messages", "must contain at least one message");
    for (size_t i = 0; !rc && i < json_array_size(in); i++) rc = anthropic_message(json_array_get(in, i), (int)i, msgs, e);
    if (!rc) rc = render(msgs, use_tools ? tools : NULL, r->response_format, &tc, lim, r, e);
    if (!rc) rc = check_tool_constraint(r, e);
    json_decref(msgs);
    json_decref(tools);
    return rc;
}

/* ---- completions ----------------------------------------------------------------------------------------- */

static int parse_completions(const json_t *root, const server_parse_limits *lim, server_request *r, server_error *e) {
    long long n = 1, mt = 16, lp = 0;
    int given_lp = 0;
    if (parse_model(root, lim, 0, r, e) || refuse_unsupported(root, e) || parse_sampling(root, 2.0, r, e) ||
        parse_penalties(root, r, e) || parse_stream(root, r, e) || parse_stop(root, "stop", 1, lim, r, e))
        return e->status;
    if (get_int(root, "n", 1, lim->max_n, &n, NULL, e)) return e->status;
    if (get_int(root, "max_tokens", 0, 1LL << 40, &mt, NULL, e)) return e->status;
    if (get_int(root, "logprobs", 0, lim->max_top_logprobs, &lp, &given_lp, e)) return e->status;
    if (get_bool(root, "echo", &r->echo, e)) return e->status;
    if (get_bool(root, "return_token_ids", &r->return_token_ids, e)) return e->status;
    if (get_bool(root, "ignore_eos", &r->ignore_eos, e)) return e->status;
    json_t *bo = json_object_get(root, "best_of");
    if (bo && !json_is_null(bo) && !(json_is_integer(bo) && json_integer_value(bo) == n))
        return bad(e, "best_of", "is not supported (only best_of == n)");
    json_t *sfx = json_object_get(root, "suffix");
    if (sfx && !json_is_null(sfx)) return bad(e, "suffix", "is not supported by this server");
    r->n = (int)n;
    r->max_tokens = mt;
    r->logprobs = given_lp;
    r->top_logprobs = (int)lp;
    json_t *p = json_object_get(root, "prompt");
    if (!p || json_is_null(p)) return bad(e, "prompt", "is required");
    /* a one-element batch is the same as the element */
    if (json_is_array(p) && json_array_size(p) == 1 && !json_is_integer(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return bad(e, "prompt", "must not be empty");
        r->prompt_text = strdup(json_string_value(p));
        return r->prompt_text ? 0 : server_fail(e, 500, "server_error", "", "out of memory");
    }
    if (!json_is_array(p)) return bad(e, "prompt", "must be a string or an array of token ids");
    const size_t np = json_array_size(p);
    if (np == 0) return bad(e, "prompt", "must not be empty");
    r->prompt_ids = malloc(sizeof(int32_t) * np);
    if (!r->prompt_ids) return server_fail(e, 500, "server_error", "", "out of memory");
    for (size_t i = 0; i < np; i++) {
        json_t *t = json_array_get(p, i);
        char pp[64];
        snprintf(pp, sizeof pp, "prompt[%zu]", i);
        if (json_is_string(t)) return bad(e, "prompt", "batches of several prompts are not supported (send one per request)");
        if (!json_is_integer(t)) return bad(e, pp, "must be a token id (an integer)");
        const long long id = json_integer_value(t);
        if (id < 0 || id > INT32_MAX) return bad(e, pp, "token id %lld is out of range", id);
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = (int)np;
    return 0;
}

/* ---- entry point ------------------------------------------------------------------------------------------ */

void server_request_free(server_request *r) {
    if (!r) return;
    free(r->prompt_text);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->model);
    json_decref(r->response_format);
    free(r->tool_name);
    json_decref(r->tools);
    memset(r, 0, sizeof *r);
}

int server_parse_request(server_api api, const char *body, size_t len, const server_parse_limits *lim,
                         server_request *out, server_error *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    out->api = api;
    out->n = 1;
    out->tool_mode = -1;
    out->max_tokens = -1;
    out->sampling.top_p = 1.0f;
    out->sampling.temperature = 1.0f;
    json_error_t jerr;
    /* jansson rejects invalid UTF-8, NUL escapes (without JSON_ALLOW_NUL) and duplicate keys here */
    json_t *root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return server_fail(e, 400, INVALID, "", "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    int rc;
    if (!json_is_object(root)) rc = server_fail(e, 400, INVALID, "", "the body must be a JSON object");
    else if (api == SERVER_API_CHAT) rc = parse_chat(root, lim, out, e);
    else if (api == SERVER_API_MESSAGES) rc = parse_messages_api(root, lim, out, e);
    else rc = parse_completions(root, lim, out, e);
    json_decref(root);
    if (rc) server_request_free(out);
    return rc;
}
