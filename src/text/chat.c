#include "text/chat.h"
#include "text/pyjson.h"
#include "text/strbuf.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

#define FWBAR "\xef\xbd\x9c"     /* U+FF5C FULLWIDTH VERTICAL LINE */
#define LOWBLK "\xe2\x96\x81"    /* U+2581 LOWER ONE EIGHTH BLOCK */

const char DSV4_BOS_TEXT[] = "<" FWBAR "begin" LOWBLK "of" LOWBLK "sentence" FWBAR ">";
const char DSV4_EOS_TEXT[] = "<" FWBAR "end" LOWBLK "of" LOWBLK "sentence" FWBAR ">";
const char DSV4_USER_TEXT[] = "<" FWBAR "User" FWBAR ">";
const char DSV4_ASSISTANT_TEXT[] = "<" FWBAR "Assistant" FWBAR ">";
const char DSV4_THINK_TEXT[] = "<think>";
const char DSV4_THINK_END_TEXT[] = "</think>";
const char DSV4_DSML_TEXT[] = FWBAR "DSML" FWBAR;
static const char LATEST_REMINDER[] = "<" FWBAR "latest_reminder" FWBAR ">";

static const char EFFORT_ABSOLUTE_MAX[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

static const char EFFORT_BEYOND_MAX[] =
    "Reasoning Effort: Beyond maximum \xe2\x80\x94 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n";

#define DSML FWBAR "DSML" FWBAR
static const char TOOLS_HEAD[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<" DSML "tool_calls>\" block like the following:\n\n"
    "<" DSML "tool_calls>\n"
    "<" DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML "parameter>\n"
    "...\n"
    "</" DSML "invoke>\n"
    "<" DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSML "invoke>\n"
    "</" DSML "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
static const char TOOLS_TAIL[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
static const char RESPONSE_FORMAT_HEAD[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

static const struct { const char *name, *token; } TASKS[] = {
    {"action", "<" FWBAR "action" FWBAR ">"},       {"query", "<" FWBAR "query" FWBAR ">"},
    {"authority", "<" FWBAR "authority" FWBAR ">"}, {"domain", "<" FWBAR "domain" FWBAR ">"},
    {"title", "<" FWBAR "title" FWBAR ">"},         {"read_url", "<" FWBAR "read_url" FWBAR ">"},
};

void dsv4_chat_opts_default(dsv4_chat_opts *o) {
    memset(o, 0, sizeof *o);
    o->drop_thinking = 1;
    o->add_bos = 1;
}

/* ---------------------------------------------------------------- the merged message list */

typedef struct {
    char *text;          /* owned */
    int   is_tool;       /* a <tool_result> block */
    const char *call_id; /* tool_call_id of a tool block ("" if none); borrowed from the input */
} block;

typedef struct {
    const char *role;
    const json_t *src;   /* the input message this one came from (NULL for a turn made of tool results) */
    int   is_turn;       /* a user turn built by the merge step (renders its blocks) */
    block *blocks;
    int   n_blocks, cap_blocks;
    int   drop_reasoning;
} cmsg;

typedef struct {
    cmsg *v;
    int   n, cap;
} cmsg_list;

static void list_free(cmsg_list *l) {
    for (int i = 0; i < l->n; i++) {
        for (int j = 0; j < l->v[i].n_blocks; j++) free(l->v[i].blocks[j].text);
        free(l->v[i].blocks);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

static cmsg *list_push(cmsg_list *l) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        cmsg *p = realloc(l->v, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        l->v = p;
        l->cap = cap;
    }
    cmsg *m = &l->v[l->n++];
    memset(m, 0, sizeof *m);
    return m;
}

static int add_block(cmsg *m, char *text, int is_tool, const char *call_id) {
    if (!text) return -1;
    if (m->n_blocks == m->cap_blocks) {
        int cap = m->cap_blocks ? m->cap_blocks * 2 : 4;
        block *p = realloc(m->blocks, (size_t)cap * sizeof *p);
        if (!p) { free(text); return -1; }
        m->blocks = p;
        m->cap_blocks = cap;
    }
    m->blocks[m->n_blocks++] = (block){text, is_tool, call_id};
    return 0;
}

static const char *str_field(const json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Python truthiness of an optional field: absent, null, false, 0, "" and [] / {} are all "not set". */
static int truthy(const json_t *v) {
    if (!v) return 0;
    switch (json_typeof(v)) {
    case JSON_NULL: case JSON_FALSE: return 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0.0;
    default: return 1;
    }
}

/* A message's content as text: absent / null = "", a string, else an error. */
static int content_text(const json_t *msg, int i, const char **out, dsv4_error *err) {
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_null(c)) { *out = ""; return 0; }
    if (!json_is_string(c)) return dsv4_fail(err, DSV4_E_ARG, "message %d: content must be a string", i);
    *out = json_string_value(c);
    return 0;
}

/* A tool message's content: a string, or content parts whose text parts are joined by "\n\n". */
static char *tool_content(const json_t *msg) {
    json_t *c = json_object_get(msg, "content");
    if (json_is_string(c)) return strdup(json_string_value(c));
    dsv4_strbuf b;
    dsv4_sb_init(&b);
    size_t i;
    json_t *part;
    if (json_is_array(c)) json_array_foreach(c, i, part) {
        if (i) dsv4_sb_puts(&b, "\n\n");
        const char *type = str_field(part, "type");
        if (type && !strcmp(type, "text")) dsv4_sb_puts(&b, str_field(part, "text") ? str_field(part, "text") : "");
        else dsv4_sb_printf(&b, "[Unsupported %s]", type ? type : "None");
    }
    return dsv4_sb_take(&b, NULL);
}

static int merge_tool_messages(const json_t *messages, cmsg_list *l, dsv4_error *err) {
    size_t i;
    json_t *msg;
    json_array_foreach(messages, i, msg) {
        if (!json_is_object(msg)) return dsv4_fail(err, DSV4_E_ARG, "message %zu is not an object", i);
        const char *role = str_field(msg, "role");
        if (!role) return dsv4_fail(err, DSV4_E_ARG, "message %zu has no role", i);
        cmsg *last = l->n ? &l->v[l->n - 1] : NULL;
        if (!strcmp(role, "tool")) {
            const char *id = str_field(msg, "tool_call_id");
            if (!(last && last->is_turn)) {
                if (!(last = list_push(l))) goto oom;
                last->role = "user";
                last->is_turn = 1;
            }
            if (add_block(last, tool_content(msg), 1, id ? id : "")) goto oom;
        } else if (!strcmp(role, "user")) {
            const char *text = "";
            if (content_text(msg, (int)i, &text, err)) return err->code;
            /* A user message joins the turn before it unless that turn carries a task. */
            int join = last && last->is_turn && !(last->src && json_object_get(last->src, "task") &&
                                                  !json_is_null(json_object_get(last->src, "task")));
            if (!join) {
                if (!(last = list_push(l))) goto oom;
                last->role = "user";
                last->is_turn = 1;
                last->src = msg;
            }
            if (add_block(last, strdup(text), 0, NULL)) goto oom;
        } else {
            cmsg *m = list_push(l);
            if (!m) goto oom;
            m->role = role;
            m->src = msg;
        }
    }
    return 0;
oom:
    return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
}

/* Order of a call id in the most recent assistant tool_calls; 0 when unknown (Python's dict.get default). */
typedef struct { const char *id; int order; } call_order;

static void sort_tool_results(cmsg_list *l) {
    const json_t *calls = NULL;   /* tool_calls of the last assistant that had some */
    for (int i = 0; i < l->n; i++) {
        cmsg *m = &l->v[i];
        if (!strcmp(m->role, "assistant") && m->src && truthy(json_object_get(m->src, "tool_calls"))) {
            calls = json_object_get(m->src, "tool_calls");
            continue;
        }
        if (!m->is_turn || !calls) continue;
        int n_tools = 0;
        for (int j = 0; j < m->n_blocks; j++) n_tools += m->blocks[j].is_tool;
        if (n_tools < 2) continue;
        /* The official code sorts only when the id map is non-empty. */
        int any_id = 0;
        size_t k;
        json_t *tc;
        json_array_foreach(calls, k, tc) {
            const char *id = str_field(tc, "id");
            if (!id || !*id) id = str_field(json_object_get(tc, "function"), "id");
            if (id && *id) any_id = 1;
        }
        if (!any_id) continue;
        /* Stable insertion sort of the tool blocks by call order, written back into the tool positions. */
        block *tools = malloc((size_t)n_tools * sizeof *tools);
        int *key = malloc((size_t)n_tools * sizeof *key);
        if (!tools || !key) { free(tools); free(key); continue; }
        int t = 0;
        for (int j = 0; j < m->n_blocks; j++) {
            if (!m->blocks[j].is_tool) continue;
            int order = 0;
            json_array_foreach(calls, k, tc) {
                const char *id = str_field(tc, "id");
                if (!id || !*id) id = str_field(json_object_get(tc, "function"), "id");
                if (id && *id && !strcmp(id, m->blocks[j].call_id)) order = (int)k; /* later duplicates win, like a dict */
            }
            int p = t++;
            while (p > 0 && key[p - 1] > order) { tools[p] = tools[p - 1]; key[p] = key[p - 1]; p--; }
            tools[p] = m->blocks[j];
            key[p] = order;
        }
        t = 0;
        for (int j = 0; j < m->n_blocks; j++)
            if (m->blocks[j].is_tool) m->blocks[j] = tools[t++];
        free(tools);
        free(key);
    }
}

static int last_user_index(const cmsg_list *l) {
    for (int i = l->n - 1; i >= 0; i--)
        if (!strcmp(l->v[i].role, "user") || !strcmp(l->v[i].role, "developer")) return i;
    return -1;
}

/* Before the last user/developer message: assistants lose their reasoning, developer (and any role outside
 * the kept set) messages are removed. */
static void drop_thinking(cmsg_list *l) {
    int last = last_user_index(l), w = 0;
    for (int i = 0; i < l->n; i++) {
        cmsg m = l->v[i];
        const char *r = m.role;
        int keep = i >= last || !strcmp(r, "user") || !strcmp(r, "system") || !strcmp(r, "tool") ||
                   !strcmp(r, "latest_reminder") || !strcmp(r, "direct_search_results");
        if (!keep && !strcmp(r, "assistant")) { keep = 1; m.drop_reasoning = 1; }
        if (keep) l->v[w++] = m;
        else {
            for (int j = 0; j < m.n_blocks; j++) free(m.blocks[j].text);
            free(m.blocks);
        }
    }
    l->n = w;
}

/* ---------------------------------------------------------------- rendering */

static int render_tools(dsv4_strbuf *out, const json_t *tools, int idx, dsv4_error *err) {
    dsv4_sb_puts(out, TOOLS_HEAD);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        if (!fn) return dsv4_fail(err, DSV4_E_ARG, "message %d: tools[%zu] has no \"function\"", idx, i);
        if (i) dsv4_sb_putc(out, '\n');
        dsv4_pyjson_dump(out, fn);
    }
    dsv4_sb_puts(out, TOOLS_TAIL);
    return 0;
}

static void render_response_format(dsv4_strbuf *out, const json_t *rf) {
    dsv4_sb_puts(out, "\n\n");
    dsv4_sb_puts(out, RESPONSE_FORMAT_HEAD);
    dsv4_pyjson_dump(out, rf);
}

static void render_param(dsv4_strbuf *out, const char *key, const json_t *v) {
    int is_str = json_is_string(v);
    dsv4_sb_printf(out, "<" DSML "parameter name=\"%s\" string=\"%s\">", key, is_str ? "true" : "false");
    if (is_str) dsv4_sb_append(out, json_string_value(v), json_string_length(v));
    else dsv4_pyjson_dump(out, v);
    dsv4_sb_puts(out, "</" DSML "parameter>");
}

/* One invoke; arguments as the official encoder reads them: a JSON-object string is expanded into parameters,
 * anything else (unparsable text, or a non-string value) becomes one parameter named "arguments". */
static int render_invoke(dsv4_strbuf *out, const json_t *tc, int idx, dsv4_error *err) {
    json_t *fn = json_object_get(tc, "function");
    const char *name = str_field(fn, "name");
    if (!name) return dsv4_fail(err, DSV4_E_ARG, "message %d: a tool call has no function.name", idx);
    json_t *args = json_object_get(fn, "arguments");
    dsv4_sb_printf(out, "<" DSML "invoke name=\"%s\">\n", name);
    json_t *parsed = NULL;
    if (json_is_string(args)) {
        json_error_t je;
        parsed = json_loadb(json_string_value(args), json_string_length(args), JSON_DECODE_ANY, &je);
        if (parsed && !json_is_object(parsed)) {
            json_decref(parsed);
            return dsv4_fail(err, DSV4_E_ARG, "message %d: arguments of tool call '%s' are JSON but not an object",
                             idx, name);
        }
    }
    if (parsed) {
        const char *k;
        json_t *v;
        int first = 1;
        json_object_foreach(parsed, k, v) {
            if (!first) dsv4_sb_putc(out, '\n');
            first = 0;
            render_param(out, k, v);
        }
        json_decref(parsed);
    } else {
        render_param(out, "arguments", args ? args : json_null());
    }
    dsv4_sb_puts(out, "\n</" DSML "invoke>");
    return 0;
}

static const char *task_token(const char *task) {
    for (size_t i = 0; i < sizeof TASKS / sizeof TASKS[0]; i++)
        if (!strcmp(TASKS[i].name, task)) return TASKS[i].token;
    return NULL;
}

static int effort_prefix(const dsv4_chat_opts *o, const char **prefix, dsv4_error *err) {
    const char *e = o->effort;
    *prefix = "";
    if (o->encoder == DSV4_CHAT_V4_0731) {
        if (!e || !strcmp(e, "low")) return 0;
        if (!strcmp(e, "high")) { *prefix = EFFORT_ABSOLUTE_MAX; return 0; }
        if (!strcmp(e, "max")) { *prefix = EFFORT_BEYOND_MAX; return 0; }
        return dsv4_fail(err, DSV4_E_ARG, "reasoning effort '%s' is not one of low, high, max (V4-0731)", e);
    }
    if (!e || !strcmp(e, "high")) return 0;
    if (!strcmp(e, "max")) { *prefix = EFFORT_ABSOLUTE_MAX; return 0; }
    return dsv4_fail(err, DSV4_E_ARG, "reasoning effort '%s' is not one of none, high, max (V4 preview)", e);
}

static const json_t *task_of(const cmsg *m) {
    json_t *t = m->src ? json_object_get(m->src, "task") : NULL;
    return t && !json_is_null(t) ? t : NULL;
}

static int render_message(dsv4_strbuf *out, const cmsg_list *l, int idx, const dsv4_chat_opts *o, int drop,
                          const char *effort, dsv4_error *err) {
    const cmsg *m = &l->v[idx];
    const json_t *src = m->src;
    int last_user = last_user_index(l);
    if (idx == 0 && o->thinking) dsv4_sb_puts(out, effort);
    const json_t *tools = src ? json_object_get(src, "tools") : NULL;
    const json_t *rf = src ? json_object_get(src, "response_format") : NULL;
    const char *content = "";
    if (src && content_text(src, idx, &content, err)) return err->code;

    if (!strcmp(m->role, "system")) {
        dsv4_sb_puts(out, content);
        if (truthy(tools)) { dsv4_sb_puts(out, "\n\n"); if (render_tools(out, tools, idx, err)) return err->code; }
        if (truthy(rf)) render_response_format(out, rf);
    } else if (!strcmp(m->role, "developer")) {
        if (!*content) return dsv4_fail(err, DSV4_E_ARG, "message %d: a developer message needs content", idx);
        dsv4_sb_puts(out, DSV4_USER_TEXT);
        dsv4_sb_puts(out, content);
        if (truthy(tools)) { dsv4_sb_puts(out, "\n\n"); if (render_tools(out, tools, idx, err)) return err->code; }
        if (truthy(rf)) render_response_format(out, rf);
    } else if (!strcmp(m->role, "user")) {
        dsv4_sb_puts(out, DSV4_USER_TEXT);
        for (int j = 0; j < m->n_blocks; j++) {
            if (j) dsv4_sb_puts(out, "\n\n");
            if (m->blocks[j].is_tool) dsv4_sb_puts(out, "<tool_result>");
            dsv4_sb_puts(out, m->blocks[j].text);
            if (m->blocks[j].is_tool) dsv4_sb_puts(out, "</tool_result>");
        }
    } else if (!strcmp(m->role, "latest_reminder")) {
        json_t *c = json_object_get(src, "content");
        if (!json_is_string(c)) return dsv4_fail(err, DSV4_E_ARG, "message %d: latest_reminder needs content", idx);
        dsv4_sb_puts(out, LATEST_REMINDER);
        dsv4_sb_puts(out, content);
    } else if (!strcmp(m->role, "assistant")) {
        int prev_task = idx > 0 && task_of(&l->v[idx - 1]);
        if (o->thinking && !prev_task && (!drop || idx > last_user)) {
            const char *rc = m->drop_reasoning ? NULL : str_field(src, "reasoning_content");
            dsv4_sb_puts(out, rc ? rc : "");
            dsv4_sb_puts(out, DSV4_THINK_END_TEXT);
        }
        dsv4_sb_puts(out, content);
        json_t *calls = json_object_get(src, "tool_calls");
        if (truthy(calls)) {
            if (!json_is_array(calls)) return dsv4_fail(err, DSV4_E_ARG, "message %d: tool_calls must be an array", idx);
            dsv4_sb_puts(out, "\n\n<" DSML "tool_calls>\n");
            size_t k;
            json_t *tc;
            json_array_foreach(calls, k, tc) {
                if (k) dsv4_sb_putc(out, '\n');
                if (render_invoke(out, tc, idx, err)) return err->code;
            }
            dsv4_sb_puts(out, "\n</" DSML "tool_calls>");
        }
        if (!truthy(json_object_get(src, "wo_eos"))) dsv4_sb_puts(out, DSV4_EOS_TEXT);
    } else {
        return dsv4_fail(err, DSV4_E_ARG, "message %d: role '%s' is not supported", idx, m->role);
    }

    /* Transition: only when this is the last message or the next one is an assistant / latest_reminder. */
    if (idx + 1 < l->n && strcmp(l->v[idx + 1].role, "assistant") && strcmp(l->v[idx + 1].role, "latest_reminder"))
        return 0;
    const json_t *task = task_of(m);
    if (task) {
        const char *tok = json_is_string(task) ? task_token(json_string_value(task)) : NULL;
        if (!tok) return dsv4_fail(err, DSV4_E_ARG, "message %d: invalid task (valid: action, query, authority, "
                                                    "domain, title, read_url)", idx);
        if (strcmp(json_string_value(task), "action")) {
            dsv4_sb_puts(out, tok);
        } else {
            dsv4_sb_puts(out, DSV4_ASSISTANT_TEXT);
            dsv4_sb_puts(out, o->thinking ? DSV4_THINK_TEXT : DSV4_THINK_END_TEXT);
            dsv4_sb_puts(out, tok);
        }
    } else if (!strcmp(m->role, "user") || !strcmp(m->role, "developer")) {
        dsv4_sb_puts(out, DSV4_ASSISTANT_TEXT);
        int think = o->thinking && (!drop || idx >= last_user);
        dsv4_sb_puts(out, think ? DSV4_THINK_TEXT : DSV4_THINK_END_TEXT);
    }
    return 0;
}

int dsv4_chat_render(const json_t *messages, const dsv4_chat_opts *o, char **out, size_t *len, dsv4_error *err) {
    *out = NULL;
    if (!json_is_array(messages)) return dsv4_fail(err, DSV4_E_ARG, "\"messages\" must be an array");
    const char *effort;
    int rc = effort_prefix(o, &effort, err);
    if (rc) return rc;
    cmsg_list l = {0};
    if ((rc = merge_tool_messages(messages, &l, err))) { list_free(&l); return rc; }
    sort_tool_results(&l);
    /* Any `tools` (on a message that survives merging: user messages do not keep theirs) keeps all reasoning. */
    int drop = o->drop_thinking;
    for (int i = 0; i < l.n; i++)
        if (!l.v[i].is_turn && l.v[i].src && truthy(json_object_get(l.v[i].src, "tools"))) drop = 0;
    if (o->thinking && drop) drop_thinking(&l);
    dsv4_strbuf b;
    dsv4_sb_init(&b);
    if (o->add_bos) dsv4_sb_puts(&b, DSV4_BOS_TEXT);
    for (int i = 0; i < l.n && !rc; i++) rc = render_message(&b, &l, i, o, drop, effort, err);
    list_free(&l);
    if (rc) { dsv4_sb_free(&b); return rc; }
    *out = dsv4_sb_take(&b, len);
    return *out ? 0 : dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
}

int dsv4_chat_render_request(const json_t *req, char **out, size_t *len, dsv4_error *err) {
    *out = NULL;
    if (!json_is_object(req)) return dsv4_fail(err, DSV4_E_ARG, "the request must be a JSON object");
    dsv4_chat_opts o;
    dsv4_chat_opts_default(&o);
    json_t *mode = json_object_get(req, "mode");
    if (mode && !json_is_null(mode)) {
        const char *s = json_string_value(mode);
        if (s && !strcmp(s, "thinking")) o.thinking = 1;
        else if (!s || strcmp(s, "chat")) return dsv4_fail(err, DSV4_E_ARG, "\"mode\" must be \"chat\" or \"thinking\"");
    }
    json_t *effort = json_object_get(req, "effort");
    if (effort && !json_is_null(effort)) {
        if (!json_is_string(effort)) return dsv4_fail(err, DSV4_E_ARG, "\"effort\" must be null or a string");
        o.effort = json_string_value(effort);
    }
    const char *enc = str_field(req, "encoder");
    if (enc && !strcmp(enc, "v4-0731")) o.encoder = DSV4_CHAT_V4_0731;
    else if (enc && strcmp(enc, "v4")) return dsv4_fail(err, DSV4_E_ARG, "\"encoder\" must be \"v4\" or \"v4-0731\"");
    json_t *dt = json_object_get(req, "drop_thinking");
    if (dt && !json_is_null(dt)) o.drop_thinking = json_is_true(dt);
    const json_t *messages = json_object_get(req, "messages");
    if (!json_is_array(messages)) return dsv4_fail(err, DSV4_E_ARG, "the request has no \"messages\" array");

    json_t *tools = json_object_get(req, "tools"), *rf = json_object_get(req, "response_format");
    if (!truthy(tools) && !truthy(rf)) return dsv4_chat_render(messages, &o, out, len, err);
    /* Top-level tools / response_format ride on a leading system message (inserted when there is none). */
    json_t *copy = json_deep_copy(messages);
    if (!copy) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    json_t *first = json_array_get(copy, 0);
    const char *role = first ? str_field(first, "role") : NULL;
    if (!role || strcmp(role, "system")) {
        first = json_pack("{s:s, s:s}", "role", "system", "content", "");
        json_array_insert_new(copy, 0, first);
    }
    if (truthy(tools)) json_object_set(first, "tools", tools);
    if (truthy(rf)) json_object_set(first, "response_format", rf);
    int rc = dsv4_chat_render(copy, &o, out, len, err);
    json_decref(copy);
    return rc;
}
