/* A growable byte buffer with explicit ownership: the caller owns it and frees it with dsv4_sb_free, or takes
 * the NUL-terminated contents with dsv4_sb_take. An allocation failure is sticky (`oom`), so builders can append
 * freely and check once at the end instead of after every call. */
#ifndef DSV4_TEXT_STRBUF_H
#define DSV4_TEXT_STRBUF_H
#include <stddef.h>

typedef struct {
    char  *data;   /* NUL-terminated when non-NULL */
    size_t len;
    size_t cap;
    int    oom;    /* set once any append failed */
} dsv4_strbuf;

void  dsv4_sb_init(dsv4_strbuf *b);
void  dsv4_sb_free(dsv4_strbuf *b);
void  dsv4_sb_append(dsv4_strbuf *b, const void *p, size_t n);
void  dsv4_sb_puts(dsv4_strbuf *b, const char *s);
void  dsv4_sb_putc(dsv4_strbuf *b, char c);
void  dsv4_sb_printf(dsv4_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void  dsv4_sb_clear(dsv4_strbuf *b);
/* Drop the first n bytes (n <= len). */
void  dsv4_sb_consume(dsv4_strbuf *b, size_t n);
/* Hand the contents to the caller (never NULL unless oom; "" for an empty buffer) and reset b. */
char *dsv4_sb_take(dsv4_strbuf *b, size_t *len);
#endif
