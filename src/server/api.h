/* Response bodies and stream events of the two client APIs, built from a session's state (session.h).
 *
 * OpenAI (api_openai.c): chat.completion / chat.completion.chunk, text_completion, error objects
 *   {"error": {"message", "type", "param", "code"}}, the model list. Streams are SSE `data: {...}` lines ending
 *   with `data: [DONE]`; with stream_options.include_usage the last chunk before it has empty choices and the
 *   usage.
 * Anthropic (api_anthropic.c): message objects, error objects {"type": "error", "error": {"type", "message"}},
 *   and the event order of a streamed message: message_start, then per content block content_block_start,
 *   content_block_delta..., content_block_stop (thinking, then text, then each tool_use), then message_delta
 *   (stop_reason, usage) and message_stop.
 *
 * *_stream functions append every event that the session's new output allows to `out`, and the closing events
 * once every choice has ended (then s->finished = 1). They never block. */
#ifndef DSV4_SERVER_API_H
#define DSV4_SERVER_API_H
#include "server/session.h"
#include "text/strbuf.h"
#include <jansson.h>

json_t *openai_error_body(const server_error *e);
json_t *openai_models_body(const server_ctx *srv);
json_t *openai_chat_body(server_session *s);
void    openai_chat_stream(server_session *s, dsv4_strbuf *out);
json_t *openai_completion_body(server_session *s);
void    openai_completion_stream(server_session *s, dsv4_strbuf *out);

json_t *anthropic_error_body(const server_error *e);
json_t *anthropic_message_body(server_session *s);
void    anthropic_message_stream(server_session *s, dsv4_strbuf *out);

/* Append `data: <json>\n\n` (event NULL) or `event: NAME\ndata: <json>\n\n`; steals v. */
void sse_event(dsv4_strbuf *out, const char *event, json_t *v);
#endif
