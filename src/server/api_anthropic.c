/* Anthropic Messages shapes: see api.h. A message has one choice (no n). */
#include "server/api.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCK_NONE = 0, BLOCK_THINKING = 1, BLOCK_TEXT = 2, BLOCK_TOOL = 3 };

json_t *anthropic_error_body(const server_error *e) {
    /* Anthropic's error types: invalid_request_error, authentication_error, not_found_error,
     * request_too_large, rate_limit_error, api_error, overloaded_error */
    const char *type = e->status == 401 ? "authentication_error"
                     : e->status == 404 ? "not_found_error"
                     : e->status == 413 ? "request_too_large"
                     : e->status == 429 ? "rate_limit_error"
                     : e->status == 503 ? "overloaded_error"
                     : e->status >= 500 ? "api_error"
                                        : "invalid_request_error";
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message", e->message);
}

static const char *stop_reason(const server_choice *c) {
    switch (c->end) {
    case SERVER_END_EOS: return c->out.n_calls ? "tool_use" : "end_turn";
    case SERVER_END_STOP_STRING: return "stop_sequence";
    case SERVER_END_LENGTH: return "max_tokens";
    default: return "end_turn";
    }
}

static json_t *stop_sequence(const server_session *s, const server_choice *c) {
    if (c->end != SERVER_END_STOP_STRING || c->out.stop_index < 0) return json_null();
    return json_string(s->req.stop[c->out.stop_index]);
}

static void tool_id(const server_session *s, int k, char *buf, size_t n) { snprintf(buf, n, "toolu_%s_%d", s->id, k); }

/* Tool input: the arguments text parsed back into an object (the DSML parser made it from JSON values). */
static json_t *tool_input(const char *args) {
    json_t *v = json_loads(args, JSON_ALLOW_NUL, NULL);   /* \u0000 is valid JSON */
    if (json_is_object(v)) return v;
    json_decref(v);
    return json_object();
}

static json_t *usage(const server_session *s) {
    return json_pack("{s:i, s:i, s:I, s:i}", "input_tokens", s->n_prompt, "output_tokens", server_session_completion_tokens(s),
                     "cache_read_input_tokens", (json_int_t)s->cached, "cache_creation_input_tokens", 0);
}

json_t *anthropic_message_body(server_session *s) {
    server_choice *c = &s->ch[0];
    json_t *content = json_array();
    if (s->req.thinking && c->out.reasoning.len)
        json_array_append_new(content, json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                                 server_json_text(c->out.reasoning.data, c->out.reasoning.len), "signature", ""));
    if (c->out.content.len || !c->out.n_calls)
        json_array_append_new(content, json_pack("{s:s, s:o}", "type", "text", "text",
                                                 server_json_text(c->out.content.data ? c->out.content.data : "",
                                                                  c->out.content.len)));
    for (int k = 0; k < c->out.n_calls; k++) {
        char id[96];
        tool_id(s, k, id, sizeof id);
        json_array_append_new(content, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name",
                                                 c->out.calls[k].name, "input", tool_input(c->out.calls[k].arguments)));
    }
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:o}", "id", s->id, "type", "message", "role", "assistant", "model",
                     s->srv->model_name, "content", content, "stop_reason", stop_reason(c), "stop_sequence",
                     stop_sequence(s, c), "usage", usage(s));
}

/* ---- streaming ------------------------------------------------------------------------------------------------ */

static void close_block(server_session *s, dsv4_strbuf *out) {
    if (s->block_kind == BLOCK_NONE) return;
    if (s->block_kind == BLOCK_THINKING)
        sse_event(out, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index",
                                                        s->block_index, "delta", "type", "signature_delta", "signature", ""));
    sse_event(out, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", s->block_index));
    s->block_index++;
    s->block_kind = BLOCK_NONE;
}

static void open_block(server_session *s, dsv4_strbuf *out, int kind) {
    if (s->block_kind == kind) return;
    close_block(s, out);
    json_t *block = kind == BLOCK_THINKING ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")
                                           : json_pack("{s:s, s:s}", "type", "text", "text", "");
    sse_event(out, "content_block_start",
              json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", s->block_index, "content_block", block));
    s->block_kind = kind;
}

void anthropic_message_stream(server_session *s, dsv4_strbuf *out) {
    if (s->finished) return;
    server_choice *c = &s->ch[0];
    if (!s->started) {
        json_t *msg = json_pack("{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:{s:i, s:i, s:I}}", "id", s->id, "type", "message",
                                "role", "assistant", "model", s->srv->model_name, "content", "stop_reason", "stop_sequence",
                                "usage", "input_tokens", s->n_prompt, "output_tokens", 0, "cache_read_input_tokens",
                                (json_int_t)s->cached);
        sse_event(out, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message", msg));
        s->started = 1;
    }
    size_t nr, nc;
    const char *r = server_output_new_reasoning(&c->out, &nr);
    if (nr) {
        open_block(s, out, BLOCK_THINKING);
        sse_event(out, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index",
                                                        s->block_index, "delta", "type", "thinking_delta", "thinking",
                                                        server_json_text(r, nr)));
    }
    const char *t = server_output_new_content(&c->out, &nc);
    if (nc) {
        open_block(s, out, BLOCK_TEXT);
        sse_event(out, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index",
                                                        s->block_index, "delta", "type", "text_delta", "text",
                                                        server_json_text(t, nc)));
    }
    /* tool_use blocks: opened when the call's name is read, its input streamed as input_json_delta pieces (they
     * concatenate to the arguments' JSON text), closed when the call is complete */
    for (int k = c->calls_sent ? c->calls_sent - 1 : 0; k < c->out.n_begun; k++) {
        const char *name, *args;
        size_t n_args;
        const int complete = server_output_call(&c->out, k, &name, &args, &n_args);
        if (k >= c->calls_sent) {
            close_block(s, out);
            char id[96];
            tool_id(s, k, id, sizeof id);
            sse_event(out, "content_block_start",
                      json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:{}}}", "type", "content_block_start", "index", s->block_index,
                                "content_block", "type", "tool_use", "id", id, "name", name, "input"));
            s->block_kind = BLOCK_TOOL;
            c->calls_sent = k + 1;
            c->args_sent = 0;
        }
        if (n_args > c->args_sent && s->block_kind == BLOCK_TOOL) {
            sse_event(out, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index",
                                                            s->block_index, "delta", "type", "input_json_delta", "partial_json",
                                                            server_json_text(args + c->args_sent, n_args - c->args_sent)));
            c->args_sent = n_args;
        }
        if (complete && s->block_kind == BLOCK_TOOL) close_block(s, out);
    }
    if (c->end == SERVER_END_NONE) return;
    close_block(s, out);
    sse_event(out, "message_delta",
              json_pack("{s:s, s:{s:s, s:o}, s:{s:i}}", "type", "message_delta", "delta", "stop_reason", stop_reason(c),
                        "stop_sequence", stop_sequence(s, c), "usage", "output_tokens", server_session_completion_tokens(s)));
    sse_event(out, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    s->finished = 1;
}
