/* UTF-8 helpers: strict decoding, validation, and a streaming assembler for decoded token bytes.
 * Tokens are byte sequences, so a character can be split across tokens; the assembler holds an incomplete
 * character until its last byte arrives and replaces every ill-formed sequence by U+FFFD (one replacement per
 * maximal ill-formed subpart, the Unicode/WHATWG convention), so the output is always valid UTF-8. */
#ifndef DSV4_TEXT_UTF8_H
#define DSV4_TEXT_UTF8_H
#include "text/strbuf.h"
#include <stddef.h>
#include <stdint.h>

/* Decode one well-formed character at s (n bytes available). Returns its length 1..4, or 0 if the bytes at s
 * do not start a well-formed, complete character (overlongs, surrogates and > U+10FFFF are ill-formed). */
int dsv4_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* Encode cp (<= U+10FFFF) into out; returns the length. */
int dsv4_utf8_encode(uint32_t cp, char out[4]);
/* Returns n if s[0..n) is valid UTF-8, else the offset of the first ill-formed byte. */
size_t dsv4_utf8_valid_prefix(const char *s, size_t n);

typedef struct {
    unsigned char pend[4]; /* bytes of the character being assembled */
    int have;              /* how many are in pend */
    int need;              /* total length of that character */
} dsv4_utf8_stream;

void dsv4_utf8_stream_init(dsv4_utf8_stream *s);
/* Feed bytes; complete characters (and U+FFFD for ill-formed input) are appended to out. */
void dsv4_utf8_stream_push(dsv4_utf8_stream *s, const void *bytes, size_t n, dsv4_strbuf *out);
/* End of input: an incomplete pending character becomes one U+FFFD. */
void dsv4_utf8_stream_flush(dsv4_utf8_stream *s, dsv4_strbuf *out);
#endif
