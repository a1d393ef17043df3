#include "text/strbuf.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dsv4_sb_init(dsv4_strbuf *b) { memset(b, 0, sizeof *b); }

void dsv4_sb_free(dsv4_strbuf *b) {
    free(b->data);
    dsv4_sb_init(b);
}

static int sb_reserve(dsv4_strbuf *b, size_t extra) {
    if (b->oom) return 0;
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) {
        if (cap > ((size_t)-1) / 2) { b->oom = 1; return 0; }
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (!p) { b->oom = 1; return 0; }
    b->data = p;
    b->cap = cap;
    return 1;
}

void dsv4_sb_append(dsv4_strbuf *b, const void *p, size_t n) {
    if (!sb_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void dsv4_sb_puts(dsv4_strbuf *b, const char *s) { dsv4_sb_append(b, s, strlen(s)); }
void dsv4_sb_putc(dsv4_strbuf *b, char c) { dsv4_sb_append(b, &c, 1); }

void dsv4_sb_printf(dsv4_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) { b->oom = 1; return; }
    if ((size_t)n < sizeof small) { dsv4_sb_append(b, small, (size_t)n); return; }
    if (!sb_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void dsv4_sb_clear(dsv4_strbuf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

void dsv4_sb_consume(dsv4_strbuf *b, size_t n) {
    if (n >= b->len) { dsv4_sb_clear(b); return; }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = 0;
}

char *dsv4_sb_take(dsv4_strbuf *b, size_t *len) {
    if (b->oom) { dsv4_sb_free(b); return NULL; }
    if (!b->data && !sb_reserve(b, 0)) return NULL;
    if (!b->data) return NULL;
    b->data[b->len] = 0;
    char *p = b->data;
    if (len) *len = b->len;
    dsv4_sb_init(b);
    return p;
}
