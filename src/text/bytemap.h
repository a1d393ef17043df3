/* The GPT-2 "bytes to unicode" alphabet used by byte-level BPE: every byte gets a printable code point so that
 * vocabulary entries are readable strings. Printable Latin-1 bytes map to themselves; the remaining 68 bytes
 * (controls, space, DEL, C1 controls, NBSP, soft hyphen) take U+0100, U+0101, ... in byte order. */
#ifndef DSV4_TEXT_BYTEMAP_H
#define DSV4_TEXT_BYTEMAP_H
#include <stdint.h>

/* Code point standing for byte b. */
uint32_t dsv4_byte_to_cp(unsigned char b);
/* Byte a code point stands for, or -1 if cp is not part of the alphabet. */
int dsv4_cp_to_byte(uint32_t cp);
#endif
