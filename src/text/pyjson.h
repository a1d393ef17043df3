/* JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it, because the official V4 encoder
 * serializes tool schemas and tool-call arguments that way and the prompt must match byte for byte:
 *   separators ", " and ": ", object keys in their original order, non-ASCII characters written raw,
 *   only '"', '\\' and control characters below U+0020 escaped (\n \r \t \b \f, others as \u00XX),
 *   floats in Python repr form (shortest round-trip digits; 1.0, 1e+16, 1e-05, inf as Infinity).
 * Values come from jansson, whose objects keep insertion order. */
#ifndef DSV4_TEXT_PYJSON_H
#define DSV4_TEXT_PYJSON_H
#include "text/strbuf.h"
#include <jansson.h>
#include <stddef.h>

/* Append json.dumps(v, ensure_ascii=False). */
void dsv4_pyjson_dump(dsv4_strbuf *out, const json_t *v);
/* Append a quoted, escaped JSON string for s[0..n). */
void dsv4_pyjson_string(dsv4_strbuf *out, const char *s, size_t n);
/* The same without the quotes. The escaping is byte by byte, so escaping the pieces of a string one after the
 * other gives the escaping of the whole. */
void dsv4_pyjson_escape(dsv4_strbuf *out, const char *s, size_t n);
/* Append Python's repr of a float. */
void dsv4_pyjson_float(dsv4_strbuf *out, double d);
#endif
