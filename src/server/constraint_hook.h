/* The single place where constrained decoding plugs into the server.
 *
 * `tool_choice: "required"`, a named tool_choice and `response_format` (json_object / json_schema) are
 * guarantees, not hints: the output must be a tool call / JSON that matches the schema, which only constrained
 * decoding (src/engine/constraint.h: a per-token mask over the vocabulary) can promise.
 *   - response_format json_object / json_schema (OpenAI), output_config.format json_schema (Anthropic; the beta's
 *     output_format too): compiled here into a dsv4_grammar (JSON Schema subset, src/engine/json_schema.h; an
 *     unsupported keyword is a 400 naming it); each choice's engine job compiles its own copy
 *     (server_constraint_compile) and hands it to the scheduler with the server's vocabulary trie, so the
 *     content is a complete value that matches the schema. In thinking mode the reasoning stays free: the grammar
 *     is reasoning (any text without "</think>"), the </think> token, then the value (engine/reply_grammar.h),
 *     so reasoning_content / the thinking block is the model's own and the answer is the value.
 *   - tool_choice required / named (Anthropic any / tool), and auto when some OpenAI tool says "strict": true:
 *     the DSML tool-call grammar of src/engine/tool_grammar.h over the request's tools (the block with one or
 *     more calls / exactly one call to the named tool / free text or a block), each call's arguments
 *     following its tool's JSON Schema. The markers are the special token ｜DSML｜, which the grammar names
 *     (the vocabulary trie keeps added tokens by text). In thinking mode the grammar starts with the reasoning
 *     and its </think> token. An unsupported keyword in a tool's schema is a 400 naming the tool. */
#ifndef DSV4_SERVER_CONSTRAINT_HOOK_H
#define DSV4_SERVER_CONSTRAINT_HOOK_H
#include "server/request.h"
#include <jansson.h>

typedef enum {
    SERVER_CONSTRAINT_RESPONSE_FORMAT = 2, /* response_format json_object / json_schema (OpenAI) */
    SERVER_CONSTRAINT_OUTPUT_FORMAT = 3,   /* {"type": "json_schema", "schema"} (Anthropic output_config.format) */
} server_constraint_kind;

/* 0 when the constraint can be enforced; otherwise a 400 naming `param`. `spec` is the request's value. */
int server_constraint_check(server_constraint_kind kind, const json_t *spec, const char *param, server_error *e);

typedef struct dsv4_grammar dsv4_grammar;
/* Compile the grammar of an accepted constraint (*out owned by the caller, dsv4_grammar_free). thinking: the reply
 * starts inside the reasoning (server_request.thinking). */
int server_constraint_compile(server_constraint_kind kind, const json_t *spec, const char *param, int thinking,
                              dsv4_grammar **out, server_error *e);

/* The grammar of the request's tool constraint (r->tool_mode >= 0): *out owned by the caller, or a 400 naming
 * tool_choice / tools. out may be NULL (only check). */
int server_constraint_tools(const server_request *r, dsv4_grammar **out, server_error *e);
#endif
