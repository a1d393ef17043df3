/* Grammars of a V4 reply in thinking mode: the reasoning is free, only what follows the end of thinking is
 * constrained (response_format in thinking mode, src/server/constraint_hook.h).
 *
 *   reply     ::= reasoning @"</think>" answer
 *   reasoning ::= any text that does not contain the text "</think>"
 *
 * The end of thinking is the special token </think>. The server splits reasoning from answer at the first
 * "</think>" of the decoded text (src/server/output.c), so the reasoning must not spell that text with ordinary
 * tokens either: otherwise the split would come early and the constrained answer would not be what the client
 * gets. Since "</think>" has no border (its only '<' is its first character), the first occurrence in
 * reasoning + "</think>" is the token: reasoning = [^<]* ("<" W)*, where W is a run of non-'<' characters that
 * does not start with "/think>". */
#ifndef DSV4_ENGINE_REPLY_GRAMMAR_H
#define DSV4_ENGINE_REPLY_GRAMMAR_H
#include "dsv4.h"
#include "engine/grammar_ir.h"
#include "engine/json_schema.h"
#include <jansson.h>

/* The rule `reasoning` in builder b (-1 when out of memory). */
int32_t dsv4_reasoning_rule(gb_builder *b);

/* response_format: the answer is a JSON value of `schema` (NULL: any JSON value, JSON mode), with o as in
 * json_schema.h (NULL: defaults). thinking: the reply starts inside the reasoning (the prompt ended with <think>);
 * 0 gives exactly dsv4_grammar_from_schema / dsv4_grammar_json_any. */
int dsv4_grammar_json_reply(const json_t *schema, const dsv4_schema_opts *o, int thinking, dsv4_grammar **out,
                            dsv4_error *err);
#endif
