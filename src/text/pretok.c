#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pretok.h"
#include "text/strbuf.h"
#include "util/error.h"
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SPLITS 16

struct dsv4_pretok {
    pcre2_code *re[MAX_SPLITS];
    int         jit[MAX_SPLITS];   /* JIT compiled successfully */
    int         n;
};

/* Oniguruma's \s: the Unicode White_Space property, written as class members. */
static const char WHITE_SPACE_MEMBERS[] =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

/* Rewrite \s and \S. Everything else is passed through: the patterns tokenizers use are in the common subset
 * of Oniguruma and PCRE2 syntax. Returns 0, or -1 for a construct we cannot rewrite faithfully (\S in a class). */
static int translate(const char *pat, dsv4_strbuf *out) {
    int in_class = 0;
    for (const char *p = pat; *p; p++) {
        if (*p == '\\' && p[1]) {
            char e = p[1];
            if (e == 's') {
                if (in_class) dsv4_sb_puts(out, WHITE_SPACE_MEMBERS);
                else { dsv4_sb_putc(out, '['); dsv4_sb_puts(out, WHITE_SPACE_MEMBERS); dsv4_sb_putc(out, ']'); }
            } else if (e == 'S') {
                if (in_class) return -1;
                dsv4_sb_puts(out, "[^"); dsv4_sb_puts(out, WHITE_SPACE_MEMBERS); dsv4_sb_putc(out, ']');
            } else {
                dsv4_sb_append(out, p, 2);
            }
            p++;
            continue;
        }
        if (!in_class && *p == '[') {
            in_class = 1;
            dsv4_sb_putc(out, '[');
            /* A ']' right after '[' or '[^' is a literal member, not the end of the class. */
            if (p[1] == '^') { dsv4_sb_putc(out, '^'); p++; }
            if (p[1] == ']') { dsv4_sb_puts(out, "\\]"); p++; }
            continue;
        }
        if (in_class && *p == ']') in_class = 0;
        dsv4_sb_putc(out, *p);
    }
    return 0;
}

int dsv4_pretok_new(dsv4_pretok **out, dsv4_error *err) {
    *out = calloc(1, sizeof **out);
    return *out ? 0 : dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
}

void dsv4_pretok_free(dsv4_pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) pcre2_code_free(p->re[i]);
    free(p);
}

int dsv4_pretok_count(const dsv4_pretok *p) { return p->n; }

int dsv4_pretok_add_split(dsv4_pretok *p, const char *pattern, dsv4_error *err) {
    if (p->n == MAX_SPLITS) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "more than %d pre-tokenizer splits", MAX_SPLITS);
    dsv4_strbuf pat;
    dsv4_sb_init(&pat);
    if (translate(pattern, &pat) != 0) {
        dsv4_sb_free(&pat);
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "pre-tokenizer regex uses \\S inside a character class: %.60s",
                         pattern);
    }
    if (pat.oom) { dsv4_sb_free(&pat); return dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); }
    int ecode;
    PCRE2_SIZE eoff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat.data, pat.len, PCRE2_UTF | PCRE2_UCP, &ecode, &eoff, NULL);
    dsv4_sb_free(&pat);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ecode, msg, sizeof msg);
        return dsv4_fail(err, DSV4_E_FORMAT, "pre-tokenizer regex does not compile (%s): %.60s", (char *)msg, pattern);
    }
    p->jit[p->n] = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    p->re[p->n++] = re;
    return 0;
}

typedef struct {
    const dsv4_pretok *p;
    pcre2_match_data  *md;
    dsv4_piece_fn      fn;
    void              *ud;
    dsv4_error        *err;
} run_ctx;

static int split_level(run_ctx *c, int level, const char *s, size_t n);

/* One leftmost-first match of step `level` in s[0..n) at or after `from`. 1 = found, 0 = none, <0 = failure. */
static int find_match(run_ctx *c, int level, const char *s, size_t n, size_t from, size_t *ms, size_t *me) {
    pcre2_code *re = c->p->re[level];
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, c->md, NULL);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && c->p->jit[level])
        /* JIT can run out of its stack on huge inputs; the interpreter uses the heap instead. */
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return dsv4_fail(c->err, DSV4_E_UNSUPPORTED, "pre-tokenizer regex failed: %s", (char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

static int split_level(run_ctx *c, int level, const char *s, size_t n) {
    if (n == 0) return 0;
    if (level == c->p->n) return c->fn(c->ud, s, n);
    size_t pos = 0, from = 0;
    while (from <= n) {
        size_t ms = 0, me = 0;
        int f = find_match(c, level, s, n, from, &ms, &me);
        if (f < 0) return f;
        if (f == 0) break;
        if (me == ms) {
            /* An empty match isolates nothing; step over one character and keep searching. */
            if (ms >= n) break;
            from = ms + 1;
            while (from < n && ((unsigned char)s[from] & 0xC0) == 0x80) from++;
            continue;
        }
        int rc;
        if (ms > pos && (rc = split_level(c, level + 1, s + pos, ms - pos))) return rc;
        if ((rc = split_level(c, level + 1, s + ms, me - ms))) return rc;
        pos = from = me;
    }
    return pos < n ? split_level(c, level + 1, s + pos, n - pos) : 0;
}

int dsv4_pretok_run(const dsv4_pretok *p, const char *text, size_t n, dsv4_piece_fn fn, void *ud,
                    dsv4_error *err) {
    if (n == 0) return 0;
    run_ctx c = {p, NULL, fn, ud, err};
    if (p->n) {
        c.md = pcre2_match_data_create(1, NULL);
        if (!c.md) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    }
    int rc = split_level(&c, 0, text, n);
    pcre2_match_data_free(c.md);
    return rc;
}
