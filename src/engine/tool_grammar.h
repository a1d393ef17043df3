/* The grammar of a V4 reply that calls tools (DSML, spec TOKENIZER_AND_CHAT.md 2.3-2.4), for constrained
 * decoding of `tool_choice` (the server) — the tool-call block with each call's arguments following its tool's
 * JSON Schema:
 *
 *   reply    ::= [reasoning @"</think>"] content block            (required / named)
 *              | [reasoning @"</think>"] content block?           (auto)
 *   block    ::= "\n\n<" @"｜DSML｜" "tool_calls>\n" invoke ("\n" invoke)* "\n</" @"｜DSML｜" "tool_calls>"
 *   invoke   ::= "<" @"｜DSML｜" "invoke name=\"" NAME "\">\n" params "\n</" @"｜DSML｜" "invoke>"
 *   params   ::= the tool's properties in schema order (required ones always, optional ones may be left out),
 *                joined by "\n", each
 *                "<" @"｜DSML｜" "parameter name=\"" KEY "\" string=\"false\">" JSON "</" @"｜DSML｜" "parameter>"
 *                with JSON a value of the property's schema (json_schema.h; '<' inside strings written as \u003c,
 *                so no value can contain the text of a closing tag), or, for a property whose schema is
 *                just {"type": "string"}, also string="true" with the raw text (no '<': the closing tag cannot
 *                appear inside it).
 *
 * reasoning: any text without the text "</think>" (engine/reply_grammar.h).
 * The markers are the special token ｜DSML｜ between BPE text, as the chat template writes them, and the block
 * is what src/text/dsml.c parses back into tool calls with arguments {"KEY": value, ...}. Modes:
 *   DSV4_TOOLS_REQUIRED  one or more calls, to any of the tools (OpenAI "required", Anthropic "any");
 *   DSV4_TOOLS_NAMED     exactly one call, to the named tool (a named function / Anthropic "tool");
 *   DSV4_TOOLS_AUTO      free text, or text then a block (OpenAI "auto" with strict tools): the arguments are
 *                        constrained once the block starts.
 * content is empty in the forced modes (the reply is the block); in auto mode it is any text. Tools whose
 * arguments are not constrained (auto mode, "strict" not true) take any parameter names and values (JSON or raw
 * text). Errors (DSV4_E_ARG) name the tool: a name that is not one line of text without quotes, an unsupported
 * keyword in its parameters, an unknown named tool. */
#ifndef DSV4_ENGINE_TOOL_GRAMMAR_H
#define DSV4_ENGINE_TOOL_GRAMMAR_H
#include "dsv4.h"
#include "engine/grammar_ir.h"
#include <jansson.h>

typedef enum { DSV4_TOOLS_AUTO = 0, DSV4_TOOLS_REQUIRED = 1, DSV4_TOOLS_NAMED = 2 } dsv4_tools_mode;

/* tools: an OpenAI tools array ([{"type": "function", "function": {"name", "parameters", "strict"}}]).
 * named: the tool of DSV4_TOOLS_NAMED. thinking: the reply starts inside the reasoning (the prompt ended with
 * <think>). */
int dsv4_grammar_tool_calls(const json_t *tools, dsv4_tools_mode mode, const char *named, int thinking,
                            dsv4_grammar **out, dsv4_error *err);
#endif
