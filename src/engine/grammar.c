/* GBNF-like grammar text -> byte grammar: see grammar.h. A recursive-descent parser; groups and quantified
 * items become anonymous rules. */
#include "engine/grammar.h"
#include "text/utf8.h"
#include "util/error.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct {
    gb_builder *b;
    const char *s;
    size_t i, n;
    dsv4_error *err;
    int failed, depth;
} gparse;

static int line_of(const gparse *g) {
    int line = 1;
    for (size_t k = 0; k < g->i && k < g->n; k++) line += g->s[k] == '\n';
    return line;
}

static int32_t fail(gparse *g, const char *what) {
    if (!g->failed) dsv4_fail(g->err, DSV4_E_ARG, "grammar line %d: %s", line_of(g), what);
    g->failed = 1;
    return -1;
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* Skip blanks, newlines and comments. */
static void skip(gparse *g) {
    while (g->i < g->n) {
        const char c = g->s[g->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') g->i++;
        else if (c == '#') { while (g->i < g->n && g->s[g->i] != '\n') g->i++; }
        else break;
    }
}

/* Length of the name at position i (0 if none). */
static size_t name_len(const gparse *g, size_t i) {
    size_t k = i;
    while (k < g->n && is_name_char(g->s[k])) k++;
    return k - i;
}

/* Is there `name ::=` at the current position? */
static int at_rule_start(const gparse *g) {
    const size_t L = name_len(g, g->i);
    if (!L) return 0;
    size_t k = g->i + L;
    while (k < g->n && (g->s[k] == ' ' || g->s[k] == '\t')) k++;
    return k + 3 <= g->n && !memcmp(g->s + k, "::=", 3);
}

static int hexval(char h) {
    return h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
}

/* One character (UTF-8 or escape) at the position; -1 on error. */
static int32_t read_char(gparse *g) {
    if (g->i >= g->n) return fail(g, "unexpected end of text");
    const unsigned char c = (unsigned char)g->s[g->i];
    if (c == '\\') {
        g->i++;
        if (g->i >= g->n) return fail(g, "trailing backslash");
        const char e = g->s[g->i++];
        int digits = 0;
        switch (e) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return (unsigned char)e;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default: return fail(g, "unknown escape");
        }
        uint32_t v = 0;
        for (int k = 0; k < digits; k++) {
            const int h = g->i < g->n ? hexval(g->s[g->i]) : -1;
            if (h < 0) return fail(g, "bad hexadecimal escape");
            v = v * 16 + (uint32_t)h;
            g->i++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return fail(g, "escape is not a Unicode scalar value");
        return (int32_t)v;
    }
    /* well-formed: the shortest encoding of a scalar value (text/utf8.c; no overlong form, surrogate or value past
     * U+10FFFF: the fuzzer's F6 88 90 94 had compiled to "U+188414") */
    uint32_t cp;
    const int len = dsv4_utf8_decode((const unsigned char *)g->s + g->i, g->n - g->i, &cp);
    if (!len) return fail(g, "ill-formed UTF-8");
    g->i += (size_t)len;
    return (int32_t)cp;
}

static void put_utf8(gb_seq *q, gb_builder *b, uint32_t c) {
    char u[4];
    gb_seq_lit(q, b, u, (size_t)dsv4_utf8_encode(c, u));
}

static int32_t parse_alternatives(gparse *g, int32_t into);

static int32_t parse_class(gparse *g) {
    g->i++; /* [ */
    int negate = 0;
    if (g->i < g->n && g->s[g->i] == '^') { negate = 1; g->i++; }
    gb_range *r = NULL;
    int n = 0, cap = 0;
    while (!g->failed) {
        if (g->i >= g->n) { fail(g, "unterminated character class"); break; }
        if (g->s[g->i] == ']') { g->i++; break; }
        const int32_t lo = read_char(g);
        if (lo < 0) break;
        int32_t hi = lo;
        if (g->i + 1 < g->n && g->s[g->i] == '-' && g->s[g->i + 1] != ']') {
            g->i++;
            if ((hi = read_char(g)) < 0) break;
            if (hi < lo) { fail(g, "a range out of order in a character class"); break; }
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            gb_range *t = realloc(r, sizeof *t * (size_t)cap);
            if (!t) { fail(g, "out of memory"); break; }
            r = t;
        }
        r[n++] = (gb_range){ (uint32_t)lo, (uint32_t)hi };
    }
    int32_t rule = -1;
    if (!g->failed && (rule = gb_class(g->b, r, n, negate)) < 0) fail(g, "a character class that matches nothing");
    free(r);
    return rule;
}

static int parse_num(gparse *g, long *v) {
    if (g->i >= g->n || g->s[g->i] < '0' || g->s[g->i] > '9') return -1;
    long x = 0;
    while (g->i < g->n && g->s[g->i] >= '0' && g->s[g->i] <= '9') {
        x = x * 10 + (g->s[g->i++] - '0');
        if (x > GB_MAX_REPEAT) return -1;
    }
    *v = x;
    return 0;
}

/* One item (without quantifier) as a rule id, or -1. */
static int32_t parse_primary(gparse *g) {
    const char c = g->s[g->i];
    if (c == '"') {
        g->i++;
        gb_seq q;
        gb_seq_init(&q);
        while (!g->failed) {
            if (g->i >= g->n) { fail(g, "unterminated string literal"); break; }
            if (g->s[g->i] == '"') { g->i++; break; }
            const int32_t ch = read_char(g);
            if (ch >= 0) put_utf8(&q, g->b, (uint32_t)ch);
        }
        const int32_t r = g->failed ? -1 : gb_rule_of(g->b, &q);
        gb_seq_free(&q);
        return r;
    }
    if (c == '@') {
        /* @"text": the special token whose text this is (its bytes are never matched as text) */
        g->i++;
        if (g->i >= g->n || g->s[g->i] != '"') return fail(g, "'@' must be followed by a quoted special-token text");
        g->i++;
        size_t start = g->i;
        while (g->i < g->n && g->s[g->i] != '"' && g->s[g->i] != '\\' && g->s[g->i] != '\n') g->i++;
        if (g->i >= g->n || g->s[g->i] != '"') return fail(g, "a special-token text is one line without escapes, closed by '\"'");
        if (g->i == start) return fail(g, "empty special-token text");
        char text[256];
        if (g->i - start >= sizeof text) return fail(g, "special-token text too long");
        memcpy(text, g->s + start, g->i - start);
        text[g->i - start] = 0;
        g->i++;
        gb_seq q;
        gb_seq_init(&q);
        gb_seq_special(&q, g->b, text);
        const int32_t r = gb_rule_of(g->b, &q);
        gb_seq_free(&q);
        return r;
    }
    if (c == '[') return parse_class(g);
    if (c == '.') {
        g->i++;
        return gb_class(g->b, NULL, 0, 1);
    }
    if (c == '(') {
        g->i++;
        if (++g->depth > MAX_DEPTH) return fail(g, "groups nested too deeply");
        const int32_t r = parse_alternatives(g, gb_rule(g->b, NULL));
        g->depth--;
        if (r < 0) return -1;
        skip(g);
        if (g->i >= g->n || g->s[g->i] != ')') return fail(g, "missing ')'");
        g->i++;
        return r;
    }
    const size_t L = name_len(g, g->i);
    if (!L) {
        char msg[64];
        snprintf(msg, sizeof msg, "unexpected character '%c'", c);
        return fail(g, msg);
    }
    char nm[128];
    if (L >= sizeof nm) return fail(g, "rule name too long");
    memcpy(nm, g->s + g->i, L);
    nm[L] = 0;
    g->i += L;
    return gb_rule_named(g->b, nm);
}

/* x{lo,hi} with lo 0 or 1 and hi 1 or unbounded (-1): *, +, ? and their {n,m} spellings. */
static int simple_repeat(long lo, long hi) { return (lo == 0 || lo == 1) && (hi == 1 || hi == -1); }

/* A primary and its postfix operators. Consecutive simple operators fold into one before any rule is made, since
 * (x{a,b}){c,d} = x{a*c, b*d} when a, c are 0 or 1 and b, d are 1 or unbounded: the counts reachable are [a*c, b*d]
 * (an unbounded factor makes the product unbounded). Without it x++++... nested one rule per operator and the
 * parse stacks multiplied with the depth (the grammar fuzzer's slow-plus-chain input: 34 s for 100 pluses). */
static int32_t parse_item(gparse *g) {
    int32_t r = parse_primary(g);
    if (r < 0) return -1;
    long plo = 1, phi = 1;   /* the pending repetition of r; x{1,1} = x */
    for (;;) {
        const char c = g->i < g->n ? g->s[g->i] : 0;
        long lo, hi;
        if (c == '*') { lo = 0; hi = -1; g->i++; }
        else if (c == '+') { lo = 1; hi = -1; g->i++; }
        else if (c == '?') { lo = 0; hi = 1; g->i++; }
        else if (c == '{') {
            g->i++;
            if (parse_num(g, &lo)) return fail(g, "bad {n,m} count (at most 100000)");
            hi = lo;
            if (g->i < g->n && g->s[g->i] == ',') {
                g->i++;
                if (g->i < g->n && g->s[g->i] == '}') hi = -1;
                else if (parse_num(g, &hi)) return fail(g, "bad {n,m} count (at most 100000)");
            }
            if (g->i >= g->n || g->s[g->i] != '}') return fail(g, "missing '}'");
            g->i++;
            if (hi >= 0 && hi < lo) return fail(g, "{n,m} with m < n");
        } else break;
        if (simple_repeat(plo, phi) && simple_repeat(lo, hi)) {
            phi = phi < 0 || hi < 0 ? -1 : phi * hi;
            plo *= lo;
            continue;
        }
        if (!(plo == 1 && phi == 1) && (r = gb_repeat(g->b, r, plo, phi)) < 0) return fail(g, "out of memory");
        plo = lo;
        phi = hi;
    }
    if (!(plo == 1 && phi == 1) && (r = gb_repeat(g->b, r, plo, phi)) < 0) return fail(g, "out of memory");
    return r;
}

/* Alternatives into rule `into` until ')' or the next rule or the end. */
static int32_t parse_alternatives(gparse *g, int32_t into) {
    gb_seq q;
    gb_seq_init(&q);
    for (;;) {
        gb_seq_clear(&q);
        for (;;) {
            skip(g);
            if (g->i >= g->n || g->s[g->i] == '|' || g->s[g->i] == ')' || at_rule_start(g)) break;
            const int32_t it = parse_item(g);
            if (it < 0) break;
            gb_seq_ref(&q, it);
        }
        if (g->failed) break;
        gb_add_alt(g->b, into, &q);
        if (g->i < g->n && g->s[g->i] == '|') { g->i++; continue; }
        break;
    }
    gb_seq_free(&q);
    return g->failed ? -1 : into;
}

int dsv4_grammar_from_gbnf(const char *text, size_t n, dsv4_grammar **out, dsv4_error *err) {
    *out = NULL;
    gparse g = { gb_new(), text, 0, n, err, 0, 0 };
    if (!g.b) return dsv4_fail(err, DSV4_E_NOMEM, "grammar: out of memory");
    for (;;) {
        skip(&g);
        if (g.i >= g.n) break;
        if (!at_rule_start(&g)) { fail(&g, "expected a rule `name ::= ...`"); break; }
        const size_t L = name_len(&g, g.i);
        char nm[128];
        if (L >= sizeof nm) { fail(&g, "rule name too long"); break; }
        memcpy(nm, text + g.i, L);
        nm[L] = 0;
        const int32_t r = gb_rule_named(g.b, nm);
        if (gb_rule_defined(g.b, r)) {
            char msg[200];
            snprintf(msg, sizeof msg, "rule '%s' is defined twice", nm);
            fail(&g, msg);
            break;
        }
        g.i += L;
        skip(&g);
        g.i += 3; /* ::= */
        if (parse_alternatives(&g, r) < 0) break;
        if (g.i < g.n && text[g.i] == ')') { fail(&g, "unbalanced ')'"); break; }
    }
    if (g.failed) { gb_free(g.b); return err ? err->code : DSV4_E_ARG; }
    const int32_t root = gb_rule_named(g.b, "root");
    if (!gb_rule_defined(g.b, root)) { gb_free(g.b); return dsv4_fail(err, DSV4_E_ARG, "grammar: no rule named 'root'"); }
    return gb_finish(g.b, root, out, err);
}
