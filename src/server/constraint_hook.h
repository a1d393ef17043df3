/* The single place where constrained decoding plugs into the server.
 *
 * `tool_choice: "required"`, a named tool_choice and `response_format` (json_object / json_schema) are
 * guarantees, not hints: the output must be a tool call / JSON that matches the schema, which only constrained
 * decoding (src/engine/constraint.h: a per-token mask over the vocabulary) can promise.
 *   - response_format json_object / json_schema (chat mode): compiled here into a dsv4_grammar (JSON Schema
 *     subset, src/engine/json_schema.h; an unsupported keyword is a 400 naming it); each choice's engine job
 *     compiles its own copy (server_constraint_compile) and hands it to the scheduler with the server's
 *     vocabulary trie, so the content is a complete value that matches the schema. With thinking mode it is
 *     refused: the constraint would have to start after the reasoning.
 *   - tool_choice required / named: the output must be a DSML tool-call block whose arguments match the tool's
 *     schema. That needs a DSML grammar built from the tool schemas, which does not exist yet: refused with a
 *     clear 400 instead of pretending. */
#ifndef DSV4_SERVER_CONSTRAINT_HOOK_H
#define DSV4_SERVER_CONSTRAINT_HOOK_H
#include "server/request.h"
#include <jansson.h>

typedef enum {
    SERVER_CONSTRAINT_TOOL_REQUIRED = 0,   /* tool_choice "required" (Anthropic: {"type": "any"}) */
    SERVER_CONSTRAINT_TOOL_NAMED = 1,      /* tool_choice naming one function (Anthropic: {"type": "tool"}) */
    SERVER_CONSTRAINT_RESPONSE_FORMAT = 2, /* response_format json_object / json_schema */
} server_constraint_kind;

/* 0 when the constraint can be enforced; otherwise a 400 naming `param`. `spec` is the request's value. */
int server_constraint_check(server_constraint_kind kind, const json_t *spec, const char *param, server_error *e);

typedef struct dsv4_grammar dsv4_grammar;
/* Compile the grammar of an accepted constraint (*out owned by the caller, dsv4_grammar_free). */
int server_constraint_compile(server_constraint_kind kind, const json_t *spec, const char *param, dsv4_grammar **out,
                              server_error *e);
#endif
