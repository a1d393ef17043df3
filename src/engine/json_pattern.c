/* The "pattern" subset compiled into grammar rules: see json_pattern.h. A recursive-descent parser over the
 * pattern text; every atom becomes a rule so that quantifiers are gb_repeat over it. */
#include "engine/json_pattern.h"
#include "util/error.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COUNT 1000
#define MAX_DEPTH 64

typedef struct {
    gb_builder *b;
    const char *p;
    size_t i, n;
    dsv4_error *err;
    int failed;
    int depth;
    int lt;          /* '<' as \u003c */
} pparse;

static int32_t fail(pparse *q, const char *what) {
    if (!q->failed) dsv4_fail(q->err, DSV4_E_UNSUPPORTED, "pattern \"%s\": %s (at offset %zu)", q->p, what, q->i);
    q->failed = 1;
    return -1;
}

/* One UTF-8 character at q->i (advanced); -1 on ill-formed input. */
static int32_t next_char(pparse *q) {
    const unsigned char *s = (const unsigned char *)q->p;
    const unsigned char c = s[q->i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || q->i + (size_t)len > q->n) return -1;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 31) : len == 3 ? (c & 15) : (c & 7);
    for (int k = 1; k < len; k++) {
        if ((s[q->i + k] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (s[q->i + k] & 63);
    }
    q->i += (size_t)len;
    return (int32_t)cp;
}

/* ---- character sets ---------------------------------------------------------------------------------------- */

typedef struct { gb_range *r; int n, cap; } rlist;

static void radd(pparse *q, rlist *l, uint32_t lo, uint32_t hi) {
    if (l->n == l->cap) {
        int c = l->cap ? 2 * l->cap : 16;
        gb_range *r = realloc(l->r, sizeof *r * (size_t)c);
        if (!r) { fail(q, "out of memory"); return; }
        l->r = r;
        l->cap = c;
    }
    l->r[l->n++] = (gb_range){ lo, hi };
}

static int rhas(const rlist *l, uint32_t c) {
    for (int i = 0; i < l->n; i++)
        if (l->r[i].lo <= c && c <= l->r[i].hi) return 1;
    return 0;
}

/* ECMAScript \s */
static const gb_range JS_SPACE[] = { {9, 13}, {32, 32}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                     {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                                     {0xFEFF, 0xFEFF} };
static const gb_range DIGIT[] = { {'0', '9'} };
static const gb_range WORD[] = { {'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'} };

/* Complement of sorted-or-not ranges over the scalar values, appended to out. */
static void add_complement(pparse *q, rlist *out, const gb_range *r, int n) {
    uint32_t next = 0;
    /* the tables above are sorted and disjoint */
    for (int i = 0; i < n; i++) {
        if (r[i].lo > next) radd(q, out, next, r[i].lo - 1);
        next = r[i].hi + 1;
    }
    if (next <= 0x10FFFF) radd(q, out, next, 0x10FFFF);
}

/* The escape after a backslash that names a class (\d \D \w \W \s \S) into l; 1 if it was one. */
static int class_escape(pparse *q, char e, rlist *l) {
    const gb_range *t = NULL;
    int n = 0;
    if (e == 'd' || e == 'D') { t = DIGIT; n = 1; }
    else if (e == 'w' || e == 'W') { t = WORD; n = 4; }
    else if (e == 's' || e == 'S') { t = JS_SPACE; n = (int)(sizeof JS_SPACE / sizeof JS_SPACE[0]); }
    else return 0;
    if (e >= 'a') for (int i = 0; i < n; i++) radd(q, l, t[i].lo, t[i].hi);
    else add_complement(q, l, t, n);
    return 1;
}

/* A single-character escape (after the backslash, q->i at the escape letter): the code point or -1. */
static int32_t char_escape(pparse *q) {
    const char e = q->p[q->i];
    switch (e) {
    case 'n': q->i++; return '\n';
    case 't': q->i++; return '\t';
    case 'r': q->i++; return '\r';
    case 'f': q->i++; return '\f';
    case 'v': q->i++; return '\v';
    case '0': q->i++; return 0;
    case 'u': {
        if (q->i + 5 > q->n) return fail(q, "short \\u escape");
        uint32_t cp = 0;
        for (int k = 1; k <= 4; k++) {
            const char h = q->p[q->i + k];
            const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (v < 0) return fail(q, "bad \\u escape");
            cp = cp * 16 + (uint32_t)v;
        }
        q->i += 5;
        return (int32_t)cp;
    }
    }
    if (strchr("^$\\.*+?()[]{}|/-\"'", e) && e) { q->i++; return (unsigned char)e; }
    char msg[64];
    snprintf(msg, sizeof msg, "unsupported escape \\%c", e);
    return fail(q, msg);
}

/* The JSON text of one character as it appears inside a string: escapes for '"', '\\' and controls. */
static void json_char(gb_seq *s, gb_builder *b, uint32_t c, int lt) {
    char buf[8];
    if (lt && c == '<') { gb_seq_lit(s, b, "\\u003c", 6); return; }
    if (c == '"' || c == '\\') { buf[0] = '\\'; buf[1] = (char)c; gb_seq_lit(s, b, buf, 2); return; }
    if (c < 0x20) {
        const char *e = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (e) gb_seq_lit(s, b, e, 2);
        else { snprintf(buf, sizeof buf, "\\u%04x", c); gb_seq_lit(s, b, buf, 6); }
        return;
    }
    unsigned char u[4];
    int n;
    if (c < 0x80) { u[0] = (unsigned char)c; n = 1; }
    else if (c < 0x800) { u[0] = (unsigned char)(0xC0 | (c >> 6)); u[1] = (unsigned char)(0x80 | (c & 63)); n = 2; }
    else if (c < 0x10000) { u[0] = (unsigned char)(0xE0 | (c >> 12)); u[1] = (unsigned char)(0x80 | ((c >> 6) & 63)); u[2] = (unsigned char)(0x80 | (c & 63)); n = 3; }
    else { u[0] = (unsigned char)(0xF0 | (c >> 18)); u[1] = (unsigned char)(0x80 | ((c >> 12) & 63)); u[2] = (unsigned char)(0x80 | ((c >> 6) & 63)); u[3] = (unsigned char)(0x80 | (c & 63)); n = 4; }
    gb_seq_lit(s, b, (const char *)u, (size_t)n);
}

/* A rule for one character of the set (ranges l, complemented when negate), written the way json_char writes
 * it: the characters that need no escape through gb_class, plus '"', '\\', \n, \t, \r as escapes when in the
 * set (other control characters are left out: a subset, so every generated string still matches). */
static int32_t set_rule(pparse *q, rlist *l, int negate) {
    gb_builder *b = q->b;
    static const uint32_t esc[] = { '"', '\\', '\n', '\t', '\r', '<' };
    const int n_esc = q->lt ? 6 : 5;
    int32_t plain;
    if (negate) {
        /* safe and not in l = complement(l + unsafe) */
        const int n0 = l->n;
        radd(q, l, 0, 0x1F);
        radd(q, l, '"', '"');
        radd(q, l, '\\', '\\');
        if (q->lt) radd(q, l, '<', '<');
        plain = gb_class(b, l->r, l->n, 1);
        l->n = n0;
    } else {
        rlist safe = {0};
        for (int i = 0; i < l->n; i++) {
            uint32_t lo = l->r[i].lo < 0x20 ? 0x20 : l->r[i].lo;
            const uint32_t hi = l->r[i].hi;
            const uint32_t cut[3] = { '"', '<', '\\' }; /* ascending; '<' only with lt */
            for (int k = 0; k < 3 && lo <= hi; k++)
                if ((k != 1 || q->lt) && lo <= cut[k] && cut[k] <= hi) {
                    if (lo < cut[k]) radd(q, &safe, lo, cut[k] - 1);
                    lo = cut[k] + 1;
                }
            if (lo <= hi) radd(q, &safe, lo, hi);
        }
        plain = safe.n ? gb_class(b, safe.r, safe.n, 0) : -1;
        free(safe.r);
    }
    const int32_t r = gb_rule(b, NULL);
    gb_seq s;
    gb_seq_init(&s);
    int any = 0;
    if (plain >= 0) { gb_seq_ref(&s, plain); gb_add_alt(b, r, &s); any = 1; }
    for (int k = 0; k < n_esc; k++)
        if (rhas(l, esc[k]) != negate) {
            gb_seq_clear(&s);
            json_char(&s, b, esc[k], q->lt);
            gb_add_alt(b, r, &s);
            any = 1;
        }
    gb_seq_free(&s);
    if (!any) return fail(q, "a character class that matches nothing");
    return r;
}

static int32_t parse_class(pparse *q) {
    q->i++; /* [ */
    int negate = 0;
    if (q->i < q->n && q->p[q->i] == '^') { negate = 1; q->i++; }
    rlist l = {0};
    int first = 1;
    while (!q->failed) {
        if (q->i >= q->n) { fail(q, "unterminated character class"); break; }
        if (q->p[q->i] == ']' && !first) { q->i++; break; }
        first = 0;
        int32_t lo;
        if (q->p[q->i] == '\\') {
            q->i++;
            if (q->i >= q->n) { fail(q, "trailing backslash"); break; }
            if (class_escape(q, q->p[q->i], &l)) { q->i++; continue; }
            if ((lo = char_escape(q)) < 0) break;
        } else if ((lo = next_char(q)) < 0) { fail(q, "ill-formed UTF-8"); break; }
        int32_t hi = lo;
        if (q->i + 1 < q->n && q->p[q->i] == '-' && q->p[q->i + 1] != ']') {
            q->i++;
            if (q->p[q->i] == '\\') {
                q->i++;
                if (q->i >= q->n) { fail(q, "trailing backslash"); break; }
                if ((hi = char_escape(q)) < 0) break;
            } else if ((hi = next_char(q)) < 0) { fail(q, "ill-formed UTF-8"); break; }
            if (hi < lo) { fail(q, "a range out of order in a character class"); break; }
        }
        radd(q, &l, (uint32_t)lo, (uint32_t)hi);
    }
    int32_t r = q->failed ? -1 : set_rule(q, &l, negate);
    free(l.r);
    return r;
}

static int32_t parse_alt(pparse *q);

static int32_t literal_rule(pparse *q, uint32_t c) {
    gb_seq s;
    gb_seq_init(&s);
    json_char(&s, q->b, c, q->lt);
    const int32_t r = gb_rule_of(q->b, &s);
    gb_seq_free(&s);
    return r;
}

static int32_t parse_atom(pparse *q) {
    const char c = q->p[q->i];
    if (c == '(') {
        q->i++;
        if (q->i < q->n && q->p[q->i] == '?') {
            if (q->i + 1 < q->n && q->p[q->i + 1] == ':') q->i += 2;
            else return fail(q, "lookaround and named groups are not supported");
        }
        if (++q->depth > MAX_DEPTH) return fail(q, "groups nested too deeply");
        const int32_t r = parse_alt(q);
        q->depth--;
        if (r < 0) return -1;
        if (q->i >= q->n || q->p[q->i] != ')') return fail(q, "unbalanced parenthesis");
        q->i++;
        return r;
    }
    if (c == '[') return parse_class(q);
    if (c == '.') {
        q->i++;
        rlist l = {0};
        radd(q, &l, '\n', '\n');
        radd(q, &l, '\r', '\r');
        radd(q, &l, 0x2028, 0x2029);
        const int32_t r = set_rule(q, &l, 1);
        free(l.r);
        return r;
    }
    if (c == '\\') {
        q->i++;
        if (q->i >= q->n) return fail(q, "trailing backslash");
        rlist l = {0};
        if (class_escape(q, q->p[q->i], &l)) {
            q->i++;
            const int32_t r = set_rule(q, &l, 0);
            free(l.r);
            return r;
        }
        free(l.r);
        const int32_t cp = char_escape(q);
        return cp < 0 ? -1 : literal_rule(q, (uint32_t)cp);
    }
    if (c == '^' || c == '$') return fail(q, "anchors are supported only at the start (^) and the end ($)");
    if (c == '*' || c == '+' || c == '?' || c == '{') return fail(q, "a quantifier without anything to repeat");
    if (c == ')') return fail(q, "unbalanced parenthesis");
    const int32_t cp = next_char(q);
    if (cp < 0) return fail(q, "ill-formed UTF-8");
    return literal_rule(q, (uint32_t)cp);
}

static int parse_count(pparse *q, long *v) {
    if (q->i >= q->n || q->p[q->i] < '0' || q->p[q->i] > '9') return -1;
    long x = 0;
    while (q->i < q->n && q->p[q->i] >= '0' && q->p[q->i] <= '9') {
        x = x * 10 + (q->p[q->i++] - '0');
        if (x > MAX_COUNT) return -2;
    }
    *v = x;
    return 0;
}

/* A quantifier after an atom, if any: the repeated rule. */
static int32_t parse_quant(pparse *q, int32_t atom) {
    if (q->i >= q->n) return atom;
    long lo, hi;
    const char c = q->p[q->i];
    if (c == '*') { lo = 0; hi = -1; q->i++; }
    else if (c == '+') { lo = 1; hi = -1; q->i++; }
    else if (c == '?') { lo = 0; hi = 1; q->i++; }
    else if (c == '{') {
        q->i++;
        int rc = parse_count(q, &lo);
        if (rc == -2) return fail(q, "a repetition count above 1000");
        if (rc) return fail(q, "a '{' that is not a quantifier {n}, {n,} or {n,m}");
        hi = lo;
        if (q->i < q->n && q->p[q->i] == ',') {
            q->i++;
            if (q->i < q->n && q->p[q->i] == '}') hi = -1;
            else if ((rc = parse_count(q, &hi))) return fail(q, rc == -2 ? "a repetition count above 1000" : "a bad {n,m} quantifier");
        }
        if (q->i >= q->n || q->p[q->i] != '}') return fail(q, "a bad {n,m} quantifier");
        q->i++;
        if (hi >= 0 && hi < lo) return fail(q, "a {n,m} quantifier with m < n");
    } else return atom;
    if (q->i < q->n && q->p[q->i] == '?') return fail(q, "lazy quantifiers are not supported");
    if (q->i < q->n && strchr("*+?{", q->p[q->i])) return fail(q, "a quantifier after a quantifier");
    return gb_repeat(q->b, atom, lo, hi);
}

static int32_t parse_alt(pparse *q) {
    const int32_t r = gb_rule(q->b, NULL);
    gb_seq s;
    gb_seq_init(&s);
    for (;;) {
        gb_seq_clear(&s);
        while (q->i < q->n && q->p[q->i] != '|' && q->p[q->i] != ')' && !q->failed) {
            if (q->p[q->i] == '$' && q->i + 1 == q->n) break; /* the end anchor, handled by the caller */
            int32_t a = parse_atom(q);
            if (a >= 0) a = parse_quant(q, a);
            if (a < 0) break;
            gb_seq_ref(&s, a);
        }
        if (q->failed) break;
        gb_add_alt(q->b, r, &s);
        if (q->i < q->n && q->p[q->i] == '|') { q->i++; continue; }
        break;
    }
    gb_seq_free(&s);
    return q->failed ? -1 : r;
}

int32_t dsv4_pattern_rule(gb_builder *b, const char *pattern, int32_t any_char, int lt_escaped, dsv4_error *err) {
    pparse q = { b, pattern, 0, strlen(pattern), err, 0, 0, lt_escaped };
    int start = 0, end = 0;
    if (q.n && pattern[0] == '^') { start = 1; q.i = 1; }
    const int32_t core = parse_alt(&q);
    if (core < 0) return -1;
    if (q.i < q.n && pattern[q.i] == '$' && q.i + 1 == q.n) { end = 1; q.i++; }
    if (q.i != q.n) return fail(&q, q.p[q.i] == ')' ? "unbalanced parenthesis" : "unexpected character");
    gb_seq s;
    gb_seq_init(&s);
    const int32_t free_text = start && end ? -1 : gb_repeat(b, any_char, 0, -1);
    if (!start) gb_seq_ref(&s, free_text);
    gb_seq_ref(&s, core);
    if (!end) gb_seq_ref(&s, free_text);
    const int32_t r = gb_rule_of(b, &s);
    gb_seq_free(&s);
    return r;
}
