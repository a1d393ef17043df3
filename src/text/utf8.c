#include "text/utf8.h"
#include <string.h>

/* Length of the character a lead byte announces, 0 for bytes that can never start one. */
static int lead_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* The allowed range of the second byte depends on the lead byte; this is what excludes overlong forms,
 * UTF-16 surrogates and code points above U+10FFFF. Later bytes are always 80..BF. */
static int second_ok(unsigned char lead, unsigned char c) {
    switch (lead) {
    case 0xE0: return c >= 0xA0 && c <= 0xBF;
    case 0xED: return c >= 0x80 && c <= 0x9F;
    case 0xF0: return c >= 0x90 && c <= 0xBF;
    case 0xF4: return c >= 0x80 && c <= 0x8F;
    default:   return c >= 0x80 && c <= 0xBF;
    }
}

int dsv4_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    int len = lead_len(s[0]);
    if (len == 0 || (size_t)len > n) return 0;
    if (len == 1) { *cp = s[0]; return 1; }
    if (!second_ok(s[0], s[1])) return 0;
    for (int i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    uint32_t v = s[0] & (0x7F >> len);
    for (int i = 1; i < len; i++) v = (v << 6) | (s[i] & 0x3F);
    *cp = v;
    return len;
}

int dsv4_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t dsv4_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int l = dsv4_utf8_decode(u + i, n - i, &cp);
        if (!l) return i;
        i += (size_t)l;
    }
    return n;
}

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

void dsv4_utf8_stream_init(dsv4_utf8_stream *s) { memset(s, 0, sizeof *s); }

void dsv4_utf8_stream_push(dsv4_utf8_stream *s, const void *bytes, size_t n, dsv4_strbuf *out) {
    const unsigned char *p = bytes;
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (s->have == 0) {
            /* Fast path: copy a run of ASCII at once. */
            size_t j = i;
            while (j < n && p[j] < 0x80) j++;
            if (j > i) { dsv4_sb_append(out, p + i, j - i); i = j; continue; }
            int l = lead_len(c);
            if (l == 0) { dsv4_sb_append(out, REPLACEMENT, 3); i++; continue; }
            s->pend[0] = c;
            s->have = 1;
            s->need = l;
            i++;
            continue;
        }
        int ok = s->have == 1 ? second_ok(s->pend[0], c) : (c & 0xC0) == 0x80;
        if (!ok) {
            /* The pending bytes are a maximal ill-formed subpart; c is examined again as a fresh start. */
            dsv4_sb_append(out, REPLACEMENT, 3);
            s->have = 0;
            continue;
        }
        s->pend[s->have++] = c;
        i++;
        if (s->have == s->need) {
            dsv4_sb_append(out, s->pend, (size_t)s->have);
            s->have = 0;
        }
    }
}

void dsv4_utf8_stream_flush(dsv4_utf8_stream *s, dsv4_strbuf *out) {
    if (s->have) dsv4_sb_append(out, REPLACEMENT, 3);
    s->have = 0;
}
