/* DeepSeek V4 chat encoding: messages (OpenAI shapes) -> the exact prompt string, reproducing the official
 * encoder (encoding/encoding_dsv4.py, spec TOKENIZER_AND_CHAT.md section 2) byte for byte. The prompt is text;
 * tokenizing it with added-token matching turns the markers into their ids.
 *
 * Pipeline, as in the official encoder:
 *   1. merge: `tool` messages become <tool_result> blocks of a user turn; a user message following a merged
 *      user turn (without a task) joins it; blocks are joined by "\n\n".
 *   2. sort: tool results are put in the call order of the preceding assistant's tool_calls (by tool_call_id).
 *   3. drop (thinking mode, drop_thinking, and no message carries `tools`): before the last user/developer
 *      message, assistants lose reasoning_content and developer messages disappear.
 *   4. render every message and the transitions <｜Assistant｜> + <think> / </think>.
 *
 * Messages: role system | developer | user | assistant | tool | latest_reminder; fields content,
 * reasoning_content, tool_calls [{id, function: {name, arguments}}], tool_call_id, tools (on system/developer),
 * response_format, task (action/query/authority/domain/title/read_url), wo_eos (assistant without EOS). */
#ifndef DSV4_TEXT_CHAT_H
#define DSV4_TEXT_CHAT_H
#include "dsv4.h"
#include <jansson.h>
#include <stddef.h>

typedef enum {
    DSV4_CHAT_V4 = 0,       /* preview V4 (Flash / Pro / DSpark): efforts {none, high, max}; max adds a prefix */
    DSV4_CHAT_V4_0731 = 1,  /* V4-Flash-0731: efforts {low (default, empty), high, max} with new texts */
} dsv4_chat_encoder;

typedef struct {
    int         thinking;       /* 0 = chat mode, 1 = thinking mode */
    const char *effort;         /* NULL or "low" / "high" / "max" (validated against the encoder) */
    dsv4_chat_encoder encoder;
    int         drop_thinking;  /* official default 1 */
    int         add_bos;        /* official default 1 (no prior context) */
} dsv4_chat_opts;

void dsv4_chat_opts_default(dsv4_chat_opts *o);

/* Render a JSON array of messages. *out is a NUL-terminated heap string the caller frees. */
int dsv4_chat_render(const json_t *messages, const dsv4_chat_opts *o, char **out, size_t *len, dsv4_error *err);

/* Render a request object, the shape of testdata/chat_encoding/published_N.json:
 *   {"messages": [...], "mode": "chat"|"thinking", "effort": null|"high"|"max"|"low",
 *    "encoder": "v4"|"v4-0731" (optional, default v4), "drop_thinking": bool (optional, default true),
 *    "tools": [...], "response_format": {...} (optional, OpenAI top level: attached to a leading system message,
 *    or to a new empty system message inserted first, as serving layers do)} */
int dsv4_chat_render_request(const json_t *request, char **out, size_t *len, dsv4_error *err);

/* The official text pieces, for callers that build prompts incrementally (the chat REPL). */
extern const char DSV4_BOS_TEXT[], DSV4_EOS_TEXT[], DSV4_USER_TEXT[], DSV4_ASSISTANT_TEXT[], DSV4_THINK_TEXT[],
    DSV4_THINK_END_TEXT[], DSV4_DSML_TEXT[];
#endif
