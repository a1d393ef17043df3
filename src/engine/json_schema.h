/* JSON Schema -> grammar (grammar_ir.h), for constrained decoding (constraint.h).
 *
 * Supported (draft 2020-12 names; anything else is an error naming the keyword and where it is):
 *   type            "object" "array" "string" "number" "integer" "boolean" "null", or a list of them; absent:
 *                   inferred from the keywords present (object / array / string / integer ones), else any value
 *   properties      emitted in the schema's order; required ones always, optional ones may be skipped
 *   required        names not in properties are emitted after them with any value
 *   additionalProperties  false, true or a schema: extra members after the declared ones, with keys that are
 *                   none of the declared names (written without escapes). Absent: false when "properties" is
 *                   given (only declared members are generated), true otherwise
 *   items, prefixItems, minItems, maxItems      (items: a schema or false)
 *   minLength, maxLength                         (code points; an escape counts as one)
 *   pattern         the regex subset of json_pattern.h (not together with minLength/maxLength)
 *   minimum, maximum, exclusiveMinimum, exclusiveMaximum   integers only
 *   enum, const     the values exactly as jansson writes them compactly; with "type" only the values of that
 *                   type are kept
 *   anyOf, oneOf    alternatives (oneOf is generated as anyOf: alternatives should not overlap)
 *   $ref, $defs, definitions   local references ("#", "#/$defs/x", any JSON pointer into the document),
 *                   recursion included
 *   annotations     title, description, $schema, $id, $comment, default, examples, deprecated, readOnly,
 *                   writeOnly: accepted and ignored (they do not constrain values)
 *
 * Output form: compact JSON with at most max_ws whitespace bytes (space, tab, newline, carriage return) in each
 * gap where JSON allows whitespace inside a value, none before or after the value. Numbers: at most 15 integer
 * digits, 15 fraction digits and a 2-digit exponent (so that every value parses as an int64 or a finite
 * double); string escapes \uXXXX exclude surrogates and U+0000. */
#ifndef DSV4_ENGINE_JSON_SCHEMA_H
#define DSV4_ENGINE_JSON_SCHEMA_H
#include "dsv4.h"
#include "engine/grammar_ir.h"
#include <jansson.h>

typedef struct {
    int max_ws;      /* whitespace bytes per gap; 0 = compact output only */
    int lt_escaped;  /* '<' inside strings only as \u003c (values embedded in DSML, where '<' could start a tag) */
} dsv4_schema_opts;

#define DSV4_SCHEMA_DEFAULT_WS 4

/* o may be NULL (defaults). The schema is only read. */
int dsv4_grammar_from_schema(const json_t *schema, const dsv4_schema_opts *o, dsv4_grammar **out, dsv4_error *err);
/* The schema as JSON text (n bytes). A text that is not JSON is a DSV4_E_FORMAT error with jansson's position. */
int dsv4_grammar_from_schema_text(const char *text, size_t n, const dsv4_schema_opts *o, dsv4_grammar **out,
                                  dsv4_error *err);
/* The rule of sub-schema `schema` of document `root` (where its $refs point; NULL schema: any JSON value) in an
 * existing builder, for grammars that embed JSON values (the DSML tool-call grammar). where: the JSON pointer
 * that error messages start from (NULL: "#"). Returns the rule id, or -1 with err set. */
int32_t dsv4_schema_rule(gb_builder *b, const json_t *root, const json_t *schema, const dsv4_schema_opts *o,
                         const char *where, dsv4_error *err);
/* JSON mode: any JSON value. */
int dsv4_grammar_json_any(const dsv4_schema_opts *o, dsv4_grammar **out, dsv4_error *err);
#endif
