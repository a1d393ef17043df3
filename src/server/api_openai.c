/* OpenAI shapes: chat completions, legacy completions, errors, models. See api.h. */
#include "server/api.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sse_event(dsv4_strbuf *out, const char *event, json_t *v) {
    char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
    if (event) dsv4_sb_printf(out, "event: %s\n", event);
    dsv4_sb_puts(out, "data: ");
    dsv4_sb_puts(out, s ? s : "{}");
    dsv4_sb_puts(out, "\n\n");
    free(s);
    json_decref(v);
}

json_t *openai_error_body(const server_error *e) {
    return json_pack("{s:{s:s, s:s, s:s?, s:n}}", "error", "message", e->message, "type", e->type, "param",
                     e->param[0] ? e->param : NULL, "code");
}

json_t *openai_models_body(const server_ctx *srv) {
    return json_pack("{s:s, s:[{s:s, s:s, s:i, s:s, s:I}]}", "object", "list", "data", "id", srv->model_name, "object",
                     "model", "created", (int)srv->created, "owned_by", "dsv4", "max_model_len", (json_int_t)srv->ctx);
}

static const char *finish_reason(const server_choice *c) {
    switch (c->end) {
    case SERVER_END_EOS: return c->out.n_calls ? "tool_calls" : "stop";
    case SERVER_END_STOP_STRING: return "stop";
    case SERVER_END_LENGTH: return "length";
    case SERVER_END_CANCELLED: return "abort";
    case SERVER_END_ERROR: return "error";
    default: return NULL;
    }
}

static json_t *usage(const server_session *s) {
    const int c = server_session_completion_tokens(s);
    return json_pack("{s:i, s:i, s:i, s:{s:I}}", "prompt_tokens", s->n_prompt, "completion_tokens", c, "total_tokens",
                     s->n_prompt + c, "prompt_tokens_details", "cached_tokens", (json_int_t)s->cached);
}

/* ---- logprobs ------------------------------------------------------------------------------------------ */

static json_t *token_text(const server_session *s, int32_t id) {
    size_t n = 0;
    const char *b = dsv4_tokenizer_token_bytes(s->srv->tok, id, &n);
    return server_json_text(b ? b : "", b ? n : 0);
}

static json_t *token_bytes(const server_session *s, int32_t id) {
    size_t n = 0;
    const char *b = dsv4_tokenizer_token_bytes(s->srv->tok, id, &n);
    json_t *a = json_array();
    for (size_t i = 0; b && i < n; i++) json_array_append_new(a, json_integer((unsigned char)b[i]));
    return a;
}

/* Chat logprobs of log[from, to): {"content": [{token, logprob, bytes, top_logprobs}]} */
static json_t *chat_logprobs(const server_session *s, const server_choice *c, int from, int to) {
    json_t *content = json_array();
    for (int i = from; i < to; i++) {
        const server_token *t = &c->log[i];
        json_t *top = json_array();
        for (int k = 0; k < t->n_top && k < s->req.top_logprobs; k++)
            json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", token_text(s, t->top[k].id), "logprob",
                                                 (double)t->top[k].logprob, "bytes", token_bytes(s, t->top[k].id)));
        json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token", token_text(s, t->id), "logprob",
                                                 (double)t->logprob, "bytes", token_bytes(s, t->id), "top_logprobs", top));
    }
    return json_pack("{s:o}", "content", content);
}

/* Completions logprobs of log[from, to): {tokens, token_logprobs, top_logprobs, text_offset}. */
static json_t *completion_logprobs(const server_session *s, const server_choice *c, int from, int to, size_t offset0) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t off = offset0;
    for (int i = from; i < to; i++) {
        const server_token *t = &c->log[i];
        json_t *tt = token_text(s, t->id);
        json_array_append_new(tokens, tt);
        json_array_append_new(lps, json_real(t->logprob));
        json_t *top = json_object();
        for (int k = 0; k < t->n_top && k < s->req.top_logprobs; k++) {
            json_t *name = token_text(s, t->top[k].id);
            json_object_set_new(top, json_string_value(name), json_real(t->top[k].logprob));
            json_decref(name);
        }
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += json_string_length(tt);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops, "text_offset", offs);
}

/* vLLM's return_token_ids: the ids of log[from, to) */
static json_t *ids_json(const server_choice *c, int from, int to) {
    json_t *a = json_array();
    for (int i = from; i < to; i++) json_array_append_new(a, json_integer(c->log[i].id));
    return a;
}

static void add_prompt_ids(const server_session *s, json_t *body) {
    if (!s->req.return_token_ids) return;
    json_t *a = json_array();
    for (int i = 0; i < s->n_prompt; i++) json_array_append_new(a, json_integer(s->prompt[i]));
    json_object_set_new(body, "prompt_token_ids", a);
}

/* A stream chunk's choice gets the ids of the tokens read since the last chunk. */
static void add_new_ids(const server_session *s, server_choice *c, json_t *ch) {
    if (!s->req.return_token_ids) return;
    json_object_set_new(ch, "token_ids", ids_json(c, c->ids_taken, c->n_log));
    c->ids_taken = c->n_log;
}

/* ---- chat completions -------------------------------------------------------------------------------------- */

static json_t *tool_calls_json(const server_session *s, const server_choice *c) {
    json_t *a = json_array();
    const int ci = (int)(c - s->ch);
    for (int k = 0; k < c->out.n_calls; k++) {
        char id[96];
        snprintf(id, sizeof id, "call_%s_%d_%d", s->id, ci, k);
        json_t *call = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name",
                                 c->out.calls[k].name, "arguments", c->out.calls[k].arguments);
        json_array_append_new(a, call);
    }
    return a;
}

/* The stream's tool-call deltas: a call's first entry carries its index, id, type, name and the arguments so
 * far; later entries carry the index and the arguments' next piece (OpenAI's tool_calls[].function.arguments
 * fragments, which clients concatenate). NULL when nothing is new. */
static json_t *tool_call_deltas(const server_session *s, server_choice *c) {
    json_t *a = NULL;
    const int ci = (int)(c - s->ch);
    for (int k = c->calls_sent ? c->calls_sent - 1 : 0; k < c->out.n_begun; k++) {
        const char *name, *args;
        size_t n_args;
        server_output_call(&c->out, k, &name, &args, &n_args);
        json_t *entry;
        if (k >= c->calls_sent) {
            char id[96];
            snprintf(id, sizeof id, "call_%s_%d_%d", s->id, ci, k);
            entry = json_pack("{s:i, s:s, s:s, s:{s:s, s:o}}", "index", k, "id", id, "type", "function", "function", "name",
                              name, "arguments", server_json_text(args, n_args));
            c->calls_sent = k + 1;
        } else if (n_args > c->args_sent) {
            entry = json_pack("{s:i, s:{s:o}}", "index", k, "function", "arguments",
                              server_json_text(args + c->args_sent, n_args - c->args_sent));
        } else {
            continue;
        }
        c->args_sent = n_args;
        if (!a) a = json_array();
        json_array_append_new(a, entry);
    }
    return a;
}

json_t *openai_chat_body(server_session *s) {
    json_t *choices = json_array();
    for (int i = 0; i < s->req.n; i++) {
        server_choice *c = &s->ch[i];
        json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content",
                                (c->out.content.len || !c->out.n_calls)
                                    ? server_json_text(c->out.content.data ? c->out.content.data : "", c->out.content.len)
                                    : json_null());
        if (s->req.thinking)
            json_object_set_new(msg, "reasoning_content",
                                server_json_text(c->out.reasoning.data ? c->out.reasoning.data : "", c->out.reasoning.len));
        if (c->out.n_calls) json_object_set_new(msg, "tool_calls", tool_calls_json(s, c));
        json_t *ch = json_pack("{s:i, s:o, s:s?}", "index", i, "message", msg, "finish_reason", finish_reason(c));
        json_object_set_new(ch, "logprobs", s->req.logprobs ? chat_logprobs(s, c, 0, c->n_log) : json_null());
        if (s->req.return_token_ids) json_object_set_new(ch, "token_ids", ids_json(c, 0, c->n_log));
        json_array_append_new(choices, ch);
    }
    json_t *body = json_pack("{s:s, s:s, s:i, s:s, s:o, s:o}", "id", s->id, "object", "chat.completion", "created",
                             (int)s->created, "model", s->srv->model_name, "choices", choices, "usage", usage(s));
    add_prompt_ids(s, body);
    return body;
}

static json_t *chunk(const server_session *s, json_t *choices) {
    return json_pack("{s:s, s:s, s:i, s:s, s:o}", "id", s->id, "object", "chat.completion.chunk", "created",
                     (int)s->created, "model", s->srv->model_name, "choices", choices);
}

void openai_chat_stream(server_session *s, dsv4_strbuf *out) {
    if (s->finished) return;
    for (int i = 0; i < s->req.n; i++) {
        server_choice *c = &s->ch[i];
        if (c->end_sent) continue;
        size_t nr, nc;
        const char *r = server_output_new_reasoning(&c->out, &nr);
        const char *t = server_output_new_content(&c->out, &nc);
        const int new_logs = s->req.logprobs && c->n_log > c->log_taken;
        const int new_ids = s->req.return_token_ids && c->n_log > c->ids_taken;
        json_t *delta = json_object();
        if (!c->role_sent) {
            json_object_set_new(delta, "role", json_string("assistant"));
            json_object_set_new(delta, "content", json_string(""));
            c->role_sent = 1;
        }
        if (nr) json_object_set_new(delta, "reasoning_content", server_json_text(r, nr));
        if (nc) json_object_set_new(delta, "content", server_json_text(t, nc));
        json_t *calls = tool_call_deltas(s, c);
        if (calls) json_object_set_new(delta, "tool_calls", calls);
        const int ending = c->end != SERVER_END_NONE;
        if (json_object_size(delta) == 0 && !new_logs && !new_ids && !ending) { json_decref(delta); continue; }
        json_t *ch = json_pack("{s:i, s:o}", "index", i, "delta", delta);
        add_new_ids(s, c, ch);
        if (new_logs) {
            json_object_set_new(ch, "logprobs", chat_logprobs(s, c, c->log_taken, c->n_log));
            c->log_taken = c->n_log;
        } else {
            json_object_set_new(ch, "logprobs", json_null());
        }
        json_object_set_new(ch, "finish_reason", ending ? json_string(finish_reason(c)) : json_null());
        if (ending) c->end_sent = 1;
        sse_event(out, NULL, chunk(s, json_pack("[o]", ch)));
    }
    int all = 1;
    for (int i = 0; i < s->req.n; i++) all &= s->ch[i].end_sent;
    if (!all) return;
    if (s->req.include_usage) {
        json_t *u = chunk(s, json_array());
        json_object_set_new(u, "usage", usage(s));
        sse_event(out, NULL, u);
    }
    dsv4_sb_puts(out, "data: [DONE]\n\n");
    s->finished = 1;
}

/* ---- completions -------------------------------------------------------------------------------------------- */

json_t *openai_completion_body(server_session *s) {
    json_t *choices = json_array();
    for (int i = 0; i < s->req.n; i++) {
        server_choice *c = &s->ch[i];
        dsv4_strbuf text;
        dsv4_sb_init(&text);
        if (s->echo_text) dsv4_sb_puts(&text, s->echo_text);
        const size_t off0 = text.len;
        if (c->out.content.len) dsv4_sb_append(&text, c->out.content.data, c->out.content.len);
        json_t *ch = json_pack("{s:i, s:o, s:s?}", "index", i, "text", server_json_text(text.data ? text.data : "", text.len),
                               "finish_reason", finish_reason(c));
        json_object_set_new(ch, "logprobs", s->req.logprobs ? completion_logprobs(s, c, 0, c->n_log, off0) : json_null());
        if (s->req.return_token_ids) json_object_set_new(ch, "token_ids", ids_json(c, 0, c->n_log));
        dsv4_sb_free(&text);
        json_array_append_new(choices, ch);
    }
    json_t *body = json_pack("{s:s, s:s, s:i, s:s, s:o, s:o}", "id", s->id, "object", "text_completion", "created",
                             (int)s->created, "model", s->srv->model_name, "choices", choices, "usage", usage(s));
    add_prompt_ids(s, body);
    return body;
}

static json_t *text_chunk(const server_session *s, int i, json_t *text, json_t *logprobs, const char *finish) {
    json_t *ch = json_pack("{s:i, s:o, s:o, s:s?}", "index", i, "text", text, "logprobs", logprobs ? logprobs : json_null(),
                           "finish_reason", finish);
    return json_pack("{s:s, s:s, s:i, s:s, s:[o]}", "id", s->id, "object", "text_completion", "created", (int)s->created,
                     "model", s->srv->model_name, "choices", ch);
}

void openai_completion_stream(server_session *s, dsv4_strbuf *out) {
    if (s->finished) return;
    for (int i = 0; i < s->req.n; i++) {
        server_choice *c = &s->ch[i];
        if (c->end_sent) continue;
        if (!c->role_sent) {
            c->role_sent = 1;
            if (s->echo_text) sse_event(out, NULL, text_chunk(s, i, json_string(s->echo_text), NULL, NULL));
        }
        size_t nc;
        const char *t = server_output_new_content(&c->out, &nc);
        const int new_logs = s->req.logprobs && c->n_log > c->log_taken;
        const int new_ids = s->req.return_token_ids && c->n_log > c->ids_taken;
        const int ending = c->end != SERVER_END_NONE;
        if (!nc && !new_logs && !new_ids && !ending) continue;
        json_t *lp = NULL;
        if (new_logs) {
            lp = completion_logprobs(s, c, c->log_taken, c->n_log, c->out.taken_content - nc);
            c->log_taken = c->n_log;
        }
        json_t *ev = text_chunk(s, i, server_json_text(t, nc), lp, ending ? finish_reason(c) : NULL);
        add_new_ids(s, c, json_array_get(json_object_get(ev, "choices"), 0));
        sse_event(out, NULL, ev);
        if (ending) c->end_sent = 1;
    }
    int all = 1;
    for (int i = 0; i < s->req.n; i++) all &= s->ch[i].end_sent;
    if (!all) return;
    if (s->req.include_usage) {
        json_t *u = json_pack("{s:s, s:s, s:i, s:s, s:[], s:o}", "id", s->id, "object", "text_completion", "created",
                              (int)s->created, "model", s->srv->model_name, "choices", "usage", usage(s));
        sse_event(out, NULL, u);
    }
    dsv4_sb_puts(out, "data: [DONE]\n\n");
    s->finished = 1;
}
