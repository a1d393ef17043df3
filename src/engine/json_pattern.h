/* The JSON Schema "pattern" keyword compiled into the grammar (not a general regex engine): the string
 * contents (between the quotes) that match the pattern, as a grammar rule.
 *
 * Supported subset (ECMAScript syntax):
 *   literals (UTF-8), escaped metacharacters (\. \* \\ \/ \- \[ ...), \n \t \r \f \v, \uXXXX
 *   .  (any character but line terminators), [abc] [a-z] [^...] with ranges and the escapes below inside
 *   \d \D \w \W \s \S
 *   groups ( ) and (?: ), alternation |, quantifiers * + ? {n} {n,} {n,m} (greedy only; counts <= 1000)
 *   ^ only at the very start, $ only at the very end; without them the match may be anywhere in the string
 *   (the free prefix / suffix is any string content)
 * Not supported (an error naming it): lookaround, backreferences, \b \B, \p{...}, lazy quantifiers, flags,
 * anchors elsewhere.
 * Generated strings write pattern characters without escapes except '"', '\\' and \n \t \r, which appear as
 * JSON escapes (and '<' as \u003c when asked); other control characters are never generated. */
#ifndef DSV4_ENGINE_JSON_PATTERN_H
#define DSV4_ENGINE_JSON_PATTERN_H
#include "dsv4.h"
#include "engine/grammar_ir.h"

/* any_char: a rule for one JSON string character in any form (used for the free prefix / suffix).
 * lt_escaped: '<' is written as \u003c (json_schema.h). Returns the rule id, or -1 with err set. */
int32_t dsv4_pattern_rule(gb_builder *b, const char *pattern, int32_t any_char, int lt_escaped, dsv4_error *err);
#endif
