/* The single place where constrained decoding plugs into the server.
 *
 * `tool_choice: "required"`, a named tool_choice and `response_format` (json_object / json_schema) are
 * guarantees, not hints: the output must be a tool call / JSON that matches the schema, which only constrained
 * decoding (a per-token mask over the vocabulary) can promise. That engine (src/engine/constraint.*) is being
 * built separately. Until it lands, server_constraint_check refuses these requests with a clear 400 instead of
 * pretending; when it lands, this function compiles the constraint (pure, so the parser stays fuzzable), the
 * server_request carries it, and the engine installs it as the request's dsv4_logits_hook (scheduler.h), next to
 * the penalties in server/logits.c. */
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
#endif
