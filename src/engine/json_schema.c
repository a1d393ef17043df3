/* JSON Schema compiler: see json_schema.h for the supported subset and the output form.
 *
 * Every schema object becomes one grammar rule, memoised by the json_t it came from, so a $ref to a schema
 * being compiled refers to its rule (recursion) and shared definitions are compiled once. Shared pieces (any
 * value, string, number, whitespace) are built once per compilation on first use. */
#include "engine/json_schema.h"
#include "engine/json_pattern.h"
#include "util/error.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INT_DIGITS 15                   /* |integer| < 10^15: parses as int64 everywhere, exact in a double */
#define INT_LIMIT 999999999999999LL
#define MAX_EXPAND 10000                    /* minItems / maxItems / minLength / maxLength expanded up to this */

typedef struct {
    gb_builder *b;
    const json_t *root;
    int max_ws;
    int lt;                                 /* dsv4_schema_opts.lt_escaped */
    dsv4_error *err;
    int failed;
    const json_t **memo_key;
    int32_t *memo_rule;
    int n_memo, cap_memo;
    int32_t r_ws, r_sep, r_colon, r_char, r_string, r_number, r_integer, r_value, r_keychar;
    char path[512];
} sc;

static int32_t compile(sc *c, const json_t *schema);

static int32_t failf(sc *c, int code, const char *fmt, const char *a, const char *b2) {
    if (!c->failed) {
        char what[400];
        snprintf(what, sizeof what, fmt, a ? a : "", b2 ? b2 : "");
        dsv4_fail(c->err, code, "json schema at %s: %s", c->path, what);
    }
    c->failed = 1;
    return -1;
}

/* path bookkeeping for error messages: push returns the old length to restore */
static size_t path_push(sc *c, const char *seg1, const char *seg2) {
    const size_t n = strlen(c->path);
    snprintf(c->path + n, sizeof c->path - n, "/%s%s%s", seg1, seg2 ? "/" : "", seg2 ? seg2 : "");
    return n;
}
static void path_pop(sc *c, size_t n) { c->path[n] = 0; }

/* ---- shared pieces ---------------------------------------------------------------------------------------- */

static int32_t lit_rule(sc *c, const char *s) {
    gb_seq q;
    gb_seq_init(&q);
    gb_seq_lit(&q, c->b, s, strlen(s));
    const int32_t r = gb_rule_of(c->b, &q);
    gb_seq_free(&q);
    return r;
}

/* JSON text as a literal; with lt, every '<' (in JSON text only ever inside a string) written as \u003c. */
static void json_lit(sc *c, gb_seq *q, const char *txt) {
    for (const char *p = txt; *p; p++) {
        if (c->lt && *p == '<') gb_seq_lit(q, c->b, "\\u003c", 6);
        else gb_seq_byte(q, c->b, (unsigned char)*p);
    }
}

static int32_t set_rule(sc *c, const char *chars) {
    gb_set set = {{0}};
    for (const char *p = chars; *p; p++) gb_set_add(&set, (unsigned char)*p);
    gb_seq q;
    gb_seq_init(&q);
    gb_seq_set(&q, c->b, &set);
    const int32_t r = gb_rule_of(c->b, &q);
    gb_seq_free(&q);
    return r;
}

static void add_ws(sc *c, gb_seq *q) {
    if (c->max_ws <= 0) return;
    if (c->r_ws < 0) c->r_ws = gb_repeat(c->b, set_rule(c, " \t\n\r"), 0, c->max_ws);
    gb_seq_ref(q, c->r_ws);
}

/* ws ',' ws */
static int32_t sep_rule(sc *c) {
    if (c->r_sep >= 0) return c->r_sep;
    gb_seq q;
    gb_seq_init(&q);
    add_ws(c, &q);
    gb_seq_byte(&q, c->b, ',');
    add_ws(c, &q);
    c->r_sep = gb_rule_of(c->b, &q);
    gb_seq_free(&q);
    return c->r_sep;
}

/* ws ':' ws */
static int32_t colon_rule(sc *c) {
    if (c->r_colon >= 0) return c->r_colon;
    gb_seq q;
    gb_seq_init(&q);
    add_ws(c, &q);
    gb_seq_byte(&q, c->b, ':');
    add_ws(c, &q);
    c->r_colon = gb_rule_of(c->b, &q);
    gb_seq_free(&q);
    return c->r_colon;
}

/* One character of a JSON string in any form: unescaped (not '"', '\\' or a control character) or an escape.
 * \uXXXX excludes the surrogates and U+0000, which JSON parsers reject alone or refuse by default. */
static int32_t char_rule(sc *c) {
    if (c->r_char >= 0) return c->r_char;
    gb_builder *b = c->b;
    const gb_range unsafe[] = { {0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {'<', '<'} };
    const int32_t plain = gb_class(b, unsafe, c->lt ? 4 : 3, 1);
    const int32_t hex = set_rule(c, "0123456789abcdefABCDEF");
    const int32_t nz = set_rule(c, "123456789abcdefABCDEF");
    gb_seq q, u;
    gb_seq_init(&q);
    gb_seq_init(&u);
    /* u4: [1-9a-cA-C]hhh | [dD][0-7]hh | [eEfF]hhh | 0 (nz hh | 0 (nz h | 0 nz)) */
    const int32_t u4 = gb_rule(b, NULL);
    const int32_t h3[3] = { hex, hex, hex };
    gb_seq_ref(&u, set_rule(c, "123456789abcABC"));
    for (int k = 0; k < 3; k++) gb_seq_ref(&u, h3[k]);
    gb_add_alt(b, u4, &u);
    gb_seq_clear(&u);
    gb_seq_ref(&u, set_rule(c, "dD"));
    gb_seq_ref(&u, set_rule(c, "01234567"));
    gb_seq_ref(&u, hex);
    gb_seq_ref(&u, hex);
    gb_add_alt(b, u4, &u);
    gb_seq_clear(&u);
    gb_seq_ref(&u, set_rule(c, "eEfF"));
    for (int k = 0; k < 3; k++) gb_seq_ref(&u, hex);
    gb_add_alt(b, u4, &u);
    const int32_t z3 = gb_rule(b, NULL); /* after "0": three more digits, not all zero */
    const int32_t z2 = gb_rule(b, NULL);
    gb_seq_clear(&u); gb_seq_ref(&u, nz); gb_seq_ref(&u, hex); gb_seq_ref(&u, hex); gb_add_alt(b, z3, &u);
    gb_seq_clear(&u); gb_seq_byte(&u, b, '0'); gb_seq_ref(&u, z2); gb_add_alt(b, z3, &u);
    gb_seq_clear(&u); gb_seq_ref(&u, nz); gb_seq_ref(&u, hex); gb_add_alt(b, z2, &u);
    gb_seq_clear(&u); gb_seq_byte(&u, b, '0'); gb_seq_ref(&u, nz); gb_add_alt(b, z2, &u);
    gb_seq_clear(&u); gb_seq_byte(&u, b, '0'); gb_seq_ref(&u, z3); gb_add_alt(b, u4, &u);
    const int32_t r = gb_rule(b, NULL);
    gb_seq_ref(&q, plain);
    gb_add_alt(b, r, &q);
    gb_seq_clear(&q);
    gb_seq_byte(&q, b, '\\');
    gb_seq_ref(&q, set_rule(c, "\"\\/bfnrt"));
    gb_add_alt(b, r, &q);
    gb_seq_clear(&q);
    gb_seq_byte(&q, b, '\\');
    gb_seq_byte(&q, b, 'u');
    gb_seq_ref(&q, u4);
    gb_add_alt(b, r, &q);
    gb_seq_free(&q);
    gb_seq_free(&u);
    return c->r_char = r;
}

/* '"' char{min,max} '"' */
static int32_t string_len_rule(sc *c, int64_t min, int64_t max) {
    gb_seq q;
    gb_seq_init(&q);
    gb_seq_byte(&q, c->b, '"');
    gb_seq_ref(&q, gb_repeat(c->b, char_rule(c), min, max));
    gb_seq_byte(&q, c->b, '"');
    const int32_t r = gb_rule_of(c->b, &q);
    gb_seq_free(&q);
    return r;
}

static int32_t string_rule(sc *c) {
    if (c->r_string < 0) c->r_string = string_len_rule(c, 0, -1);
    return c->r_string;
}

/* -? (0 | [1-9][0-9]{0,14}) */
static int32_t integer_rule(sc *c) {
    if (c->r_integer >= 0) return c->r_integer;
    gb_builder *b = c->b;
    const int32_t digits = gb_repeat(b, set_rule(c, "0123456789"), 0, MAX_INT_DIGITS - 1);
    const int32_t mag = gb_rule(b, NULL);
    gb_seq q;
    gb_seq_init(&q);
    gb_seq_byte(&q, b, '0');
    gb_add_alt(b, mag, &q);
    gb_seq_clear(&q);
    gb_seq_ref(&q, set_rule(c, "123456789"));
    gb_seq_ref(&q, digits);
    gb_add_alt(b, mag, &q);
    gb_seq_clear(&q);
    gb_seq_ref(&q, gb_repeat(b, set_rule(c, "-"), 0, 1));
    gb_seq_ref(&q, mag);
    c->r_integer = gb_rule_of(b, &q);
    gb_seq_free(&q);
    return c->r_integer;
}

/* integer ('.' [0-9]{1,15})? ([eE] [+-]? [0-9]{1,2})? */
static int32_t number_rule(sc *c) {
    if (c->r_number >= 0) return c->r_number;
    gb_builder *b = c->b;
    const int32_t digit = set_rule(c, "0123456789");
    gb_seq q;
    gb_seq_init(&q);
    gb_seq_byte(&q, b, '.');
    gb_seq_ref(&q, gb_repeat(b, digit, 1, 15));
    const int32_t frac = gb_rule_of(b, &q);
    gb_seq_clear(&q);
    gb_seq_ref(&q, set_rule(c, "eE"));
    gb_seq_ref(&q, gb_repeat(b, set_rule(c, "+-"), 0, 1));
    gb_seq_ref(&q, gb_repeat(b, digit, 1, 2));
    const int32_t exp = gb_rule_of(b, &q);
    gb_seq_clear(&q);
    gb_seq_ref(&q, integer_rule(c));
    gb_seq_ref(&q, gb_repeat(b, frac, 0, 1));
    gb_seq_ref(&q, gb_repeat(b, exp, 0, 1));
    c->r_number = gb_rule_of(b, &q);
    gb_seq_free(&q);
    return c->r_number;
}

/* Any JSON value (JSON mode, `true` schemas, unconstrained items and members). */
static int32_t value_rule(sc *c) {
    if (c->r_value >= 0) return c->r_value;
    gb_builder *b = c->b;
    const int32_t v = c->r_value = gb_rule(b, "value");
    gb_seq q;
    gb_seq_init(&q);
    /* object: '{' ws (member (sep member)*)? ws '}' */
    gb_seq_ref(&q, string_rule(c));
    gb_seq_ref(&q, colon_rule(c));
    gb_seq_ref(&q, v);
    const int32_t member = gb_rule_of(b, &q);
    gb_seq_clear(&q);
    gb_seq_ref(&q, sep_rule(c));
    gb_seq_ref(&q, member);
    const int32_t more_members = gb_repeat(b, gb_rule_of(b, &q), 0, -1);
    gb_seq_clear(&q);
    gb_seq_ref(&q, member);
    gb_seq_ref(&q, more_members);
    const int32_t members = gb_repeat(b, gb_rule_of(b, &q), 0, 1);
    gb_seq_clear(&q);
    gb_seq_byte(&q, b, '{');
    add_ws(c, &q);
    gb_seq_ref(&q, members);
    add_ws(c, &q);
    gb_seq_byte(&q, b, '}');
    gb_add_alt(b, v, &q);
    /* array */
    gb_seq_clear(&q);
    gb_seq_ref(&q, sep_rule(c));
    gb_seq_ref(&q, v);
    const int32_t more_items = gb_repeat(b, gb_rule_of(b, &q), 0, -1);
    gb_seq_clear(&q);
    gb_seq_ref(&q, v);
    gb_seq_ref(&q, more_items);
    const int32_t items = gb_repeat(b, gb_rule_of(b, &q), 0, 1);
    gb_seq_clear(&q);
    gb_seq_byte(&q, b, '[');
    add_ws(c, &q);
    gb_seq_ref(&q, items);
    add_ws(c, &q);
    gb_seq_byte(&q, b, ']');
    gb_add_alt(b, v, &q);
    const int32_t scalars[] = { string_rule(c), number_rule(c), lit_rule(c, "true"), lit_rule(c, "false"), lit_rule(c, "null") };
    for (int k = 0; k < 5; k++) {
        gb_seq_clear(&q);
        gb_seq_ref(&q, scalars[k]);
        gb_add_alt(b, v, &q);
    }
    gb_seq_free(&q);
    return v;
}

/* ---- integers in a range: decimal digit automata ------------------------------------------------------------ */

/* Append to rule r the fixed-width digit strings x..y (same width w, leading zeros allowed), as alternatives. */
static void digits_range(sc *c, int32_t r, const char *x, const char *y, int w, gb_seq *prefix) {
    gb_builder *b = c->b;
    if (w == 0) { gb_add_alt(b, r, prefix); return; }
    const int n0 = prefix->n;
    char set[11];
    if (x[0] == y[0]) {
        gb_seq_byte(prefix, b, (unsigned char)x[0]);
        digits_range(c, r, x + 1, y + 1, w - 1, prefix);
        prefix->n = n0;
        return;
    }
    char nines[32], zeros[32];
    memset(nines, '9', (size_t)w); nines[w] = 0;
    memset(zeros, '0', (size_t)w); zeros[w] = 0;
    /* x0 x[1..] .. 9s */
    gb_seq_byte(prefix, b, (unsigned char)x[0]);
    digits_range(c, r, x + 1, nines, w - 1, prefix);
    prefix->n = n0;
    /* (x0+1 .. y0-1) any */
    if (y[0] - x[0] > 1) {
        int k = 0;
        for (char d = (char)(x[0] + 1); d < y[0]; d++) set[k++] = d;
        set[k] = 0;
        gb_seq_ref(prefix, set_rule(c, set));
        for (int i = 1; i < w; i++) gb_seq_ref(prefix, set_rule(c, "0123456789"));
        gb_add_alt(b, r, prefix);
        prefix->n = n0;
    }
    /* y0 0s .. y[1..] */
    gb_seq_byte(prefix, b, (unsigned char)y[0]);
    digits_range(c, r, zeros, y + 1, w - 1, prefix);
    prefix->n = n0;
}

/* Alternatives of rule r for the non-negative integers lo..hi without leading zeros, after `sign` ("" or "-"). */
static void nonneg_range(sc *c, int32_t r, long long lo, long long hi, const char *sign) {
    gb_seq q;
    gb_seq_init(&q);
    long long p10 = 1;
    for (int w = 1; w <= MAX_INT_DIGITS && lo <= hi; w++, p10 *= 10) {
        const long long wlo = w == 1 ? 0 : p10, whi = p10 * 10 - 1;
        const long long a = lo > wlo ? lo : wlo, z = hi < whi ? hi : whi;
        if (a > z) continue;
        char x[32], y[32];
        snprintf(x, sizeof x, "%0*lld", w, a);
        snprintf(y, sizeof y, "%0*lld", w, z);
        gb_seq_clear(&q);
        gb_seq_lit(&q, c->b, sign, strlen(sign));
        digits_range(c, r, x, y, w, &q);
    }
    gb_seq_free(&q);
}

static int32_t int_range_rule(sc *c, long long lo, long long hi) {
    const int32_t r = gb_rule(c->b, NULL);
    if (lo < 0) {
        /* -(max(1,-hi)) .. -(−lo): negatives written with '-' */
        const long long nlo = hi < 0 ? -hi : 1, nhi = -lo;
        nonneg_range(c, r, nlo, nhi, "-");
    }
    if (hi >= 0) nonneg_range(c, r, lo > 0 ? lo : 0, hi, "");
    return r;
}

/* ---- keywords ---------------------------------------------------------------------------------------------- */

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ALL = 127 };

static const char *const ANNOTATIONS[] = { "title", "description", "$schema", "$id", "$comment", "default", "examples",
                                           "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL };

typedef struct { const char *name; int types; } kw;
static const kw KEYWORDS[] = {
    {"type", 0}, {"enum", 0}, {"const", 0}, {"anyOf", 0}, {"oneOf", 0}, {"$ref", 0},
    {"properties", T_OBJ}, {"required", T_OBJ}, {"additionalProperties", T_OBJ},
    {"items", T_ARR}, {"prefixItems", T_ARR}, {"minItems", T_ARR}, {"maxItems", T_ARR},
    {"minLength", T_STR}, {"maxLength", T_STR}, {"pattern", T_STR},
    {"minimum", T_INT}, {"maximum", T_INT}, {"exclusiveMinimum", T_INT}, {"exclusiveMaximum", T_INT},
    {NULL, 0}};

static int is_annotation(const char *k) {
    for (int i = 0; ANNOTATIONS[i]; i++)
        if (!strcmp(k, ANNOTATIONS[i])) return 1;
    return 0;
}
static const kw *find_kw(const char *k) {
    for (int i = 0; KEYWORDS[i].name; i++)
        if (!strcmp(k, KEYWORDS[i].name)) return &KEYWORDS[i];
    return NULL;
}

static int type_bit(const char *t) {
    static const char *const names[] = { "null", "boolean", "integer", "number", "string", "array", "object" };
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i])) return 1 << i;
    return 0;
}

/* The types the schema allows (from "type", else inferred from the keywords present), or -1 on error. */
static int schema_types(sc *c, const json_t *s) {
    const json_t *t = json_object_get(s, "type");
    if (t) {
        int bits = 0;
        if (json_is_string(t)) {
            if (!(bits = type_bit(json_string_value(t)))) return failf(c, DSV4_E_ARG, "unknown type \"%s\"", json_string_value(t), NULL);
        } else if (json_is_array(t) && json_array_size(t) > 0) {
            size_t i;
            json_t *e;
            json_array_foreach(t, i, e) {
                const int tb = json_is_string(e) ? type_bit(json_string_value(e)) : 0;
                if (!tb) return failf(c, DSV4_E_ARG, "\"type\" must name JSON types%s%s", NULL, NULL);
                bits |= tb;
            }
        } else return failf(c, DSV4_E_ARG, "\"type\" must be a string or a non-empty list of strings%s%s", NULL, NULL);
        return bits;
    }
    int bits = 0;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        const kw *w = find_kw(k);
        if (w) bits |= w->types;
    }
    return bits ? bits : T_ALL;
}

static int get_count(sc *c, const json_t *s, const char *k, int64_t *out) {
    const json_t *v = json_object_get(s, k);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0) return failf(c, DSV4_E_ARG, "\"%s\" must be a non-negative integer%s", k, NULL);
    if (json_integer_value(v) > MAX_EXPAND)
        return failf(c, DSV4_E_UNSUPPORTED, "\"%s\" above 10000 is not supported%s", k, NULL);
    *out = json_integer_value(v);
    return 1;
}

static int32_t string_schema(sc *c, const json_t *s) {
    int64_t min = 0, max = -1;
    const int has_min = get_count(c, s, "minLength", &min), has_max = get_count(c, s, "maxLength", &max);
    if (c->failed) return -1;
    const json_t *pat = json_object_get(s, "pattern");
    if (pat) {
        if (!json_is_string(pat)) return failf(c, DSV4_E_ARG, "\"pattern\" must be a string%s%s", NULL, NULL);
        if (has_min || has_max) return failf(c, DSV4_E_UNSUPPORTED, "\"pattern\" together with minLength/maxLength is not supported%s%s", NULL, NULL);
        const int32_t body = dsv4_pattern_rule(c->b, json_string_value(pat), char_rule(c), c->lt, c->err);
        if (body < 0) { if (!c->failed) dsv4_wrap(c->err, "json schema at %s", c->path); c->failed = 1; return -1; }
        gb_seq q;
        gb_seq_init(&q);
        gb_seq_byte(&q, c->b, '"');
        gb_seq_ref(&q, body);
        gb_seq_byte(&q, c->b, '"');
        const int32_t r = gb_rule_of(c->b, &q);
        gb_seq_free(&q);
        return r;
    }
    if (max >= 0 && max < min) return failf(c, DSV4_E_ARG, "maxLength is below minLength%s%s", NULL, NULL);
    return has_min || has_max ? string_len_rule(c, min, max) : string_rule(c);
}

/* Integer bound from minimum / exclusiveMinimum (lower) or maximum / exclusiveMaximum (upper). */
static int int_bound(sc *c, const json_t *s, int lower, long long *out) {
    const char *k1 = lower ? "minimum" : "maximum", *k2 = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    long long b = lower ? -INT_LIMIT : INT_LIMIT;
    for (int e = 0; e < 2; e++) {
        const char *k = e ? k2 : k1;
        const json_t *v = json_object_get(s, k);
        if (!v) continue;
        if (!json_is_number(v)) return failf(c, DSV4_E_ARG, "\"%s\" must be a number%s", k, NULL);
        const double x = json_number_value(v);
        if (!(fabs(x) <= 1e18)) return failf(c, DSV4_E_UNSUPPORTED, "\"%s\" is out of range%s", k, NULL);
        /* the smallest / largest integer satisfying the bound */
        double ib = lower ? (e ? floor(x) + 1 : ceil(x)) : (e ? ceil(x) - 1 : floor(x));
        if (ib > (double)INT_LIMIT) ib = (double)INT_LIMIT + 1;
        if (ib < -(double)INT_LIMIT) ib = -(double)INT_LIMIT - 1;
        const long long v2 = (long long)ib;
        if (lower ? v2 > b : v2 < b) b = v2;
    }
    *out = b;
    return 0;
}

static int32_t integer_schema(sc *c, const json_t *s) {
    const int bounded = json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
                        json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum");
    if (!bounded) return integer_rule(c);
    long long lo, hi;
    if (int_bound(c, s, 1, &lo) || int_bound(c, s, 0, &hi)) return -1;
    if (lo > INT_LIMIT || hi < -INT_LIMIT)
        return failf(c, DSV4_E_UNSUPPORTED, "integer bounds beyond +-(10^15 - 1) are not supported%s%s", NULL, NULL);
    if (lo > hi) return failf(c, DSV4_E_ARG, "no integer lies between minimum and maximum%s%s", NULL, NULL);
    return int_range_rule(c, lo, hi);
}

static int32_t array_schema(sc *c, const json_t *s) {
    gb_builder *b = c->b;
    const json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    if (prefix && !json_is_array(prefix)) return failf(c, DSV4_E_ARG, "\"prefixItems\" must be an array%s%s", NULL, NULL);
    if (items && json_is_array(items))
        return failf(c, DSV4_E_UNSUPPORTED, "\"items\" as an array (draft 4 tuples) is not supported: use prefixItems%s%s", NULL, NULL);
    const int64_t k = prefix ? (int64_t)json_array_size(prefix) : 0;
    int64_t min = 0, max = -1;
    get_count(c, s, "minItems", &min);
    get_count(c, s, "maxItems", &max);
    if (c->failed) return -1;
    if (items && json_is_false(items) && (max < 0 || max > k)) max = k;
    if (max >= 0 && max < min) return failf(c, DSV4_E_ARG, "the array can never have minItems items%s%s", NULL, NULL);
    /* element rules: prefixItems[i] then items */
    int32_t *pos = calloc((size_t)k + 1, sizeof *pos);
    if (!pos) return failf(c, DSV4_E_NOMEM, "out of memory%s%s", NULL, NULL);
    char idx[32];
    for (int64_t i = 0; i < k && !c->failed; i++) {
        snprintf(idx, sizeof idx, "%lld", (long long)i);
        const size_t pl = path_push(c, "prefixItems", idx);
        pos[i] = compile(c, json_array_get(prefix, (size_t)i));
        path_pop(c, pl);
    }
    int32_t rest = -1;
    if (!c->failed && (max < 0 || max > k)) {
        const size_t pl = path_push(c, "items", NULL);
        rest = items ? compile(c, items) : value_rule(c);
        path_pop(c, pl);
    }
    if (c->failed) { free(pos); return -1; }
#define ELEM(i) ((i) < k ? pos[i] : rest)
    const int32_t sep = sep_rule(c);
    gb_seq q, e;
    gb_seq_init(&q);
    gb_seq_init(&e);
    /* R_i: what may follow once i elements are written */
    const int64_t M = max >= 0 ? max : (k > min ? k : min);
    int32_t next = -1; /* R_{i+1} */
    int32_t loop = -1;
    if (max < 0) {
        gb_seq_ref(&q, sep);
        gb_seq_ref(&q, rest);
        loop = gb_repeat(b, gb_rule_of(b, &q), 0, -1);
    }
    for (int64_t i = M; i >= 1; i--) {
        int32_t r;
        if (i == M && max < 0) r = loop;
        else if (i == M) r = gb_rule_of(b, &e);            /* max reached */
        else {
            r = gb_rule(b, NULL);
            gb_seq_clear(&q);
            gb_seq_ref(&q, sep);
            gb_seq_ref(&q, ELEM(i));
            gb_seq_ref(&q, next);
            gb_add_alt(b, r, &q);
            if (i >= min) gb_add_alt(b, r, &e);
        }
        next = r;
    }
    const int32_t content = gb_rule(b, NULL);
    if (M > 0 || max < 0) {
        gb_seq_clear(&q);
        gb_seq_ref(&q, ELEM(0));
        if (next >= 0) gb_seq_ref(&q, next);
        else if (loop >= 0) gb_seq_ref(&q, loop);
        gb_add_alt(b, content, &q);
    }
    if (min == 0) gb_add_alt(b, content, &e);
#undef ELEM
    gb_seq_clear(&q);
    gb_seq_byte(&q, b, '[');
    add_ws(c, &q);
    gb_seq_ref(&q, content);
    add_ws(c, &q);
    gb_seq_byte(&q, b, ']');
    const int32_t r = gb_rule_of(b, &q);
    gb_seq_free(&q);
    gb_seq_free(&e);
    free(pos);
    return r;
}

/* A JSON string key that is none of the declared names, written without escapes: a trie over the names' code
 * points; at each node the next character may leave the trie (then anything may follow) or follow a branch. */
typedef struct { const char *s; size_t n; } name;

static int32_t other_key_node(sc *c, const name *names, int n_names, size_t depth) {
    gb_builder *b = c->b;
    /* names here share their first `depth` bytes */
    if (c->r_keychar < 0) {
        const gb_range unsafe[] = { {0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {'<', '<'} };
        c->r_keychar = gb_class(b, unsafe, c->lt ? 4 : 3, 1);
    }
    const int32_t r = gb_rule(b, NULL);
    gb_seq q;
    gb_seq_init(&q);
    int ends_here = 0;
    for (int i = 0; i < n_names; i++) ends_here |= names[i].n == depth;
    if (!ends_here) { gb_seq_byte(&q, b, '"'); gb_add_alt(b, r, &q); }
    /* the distinct next characters (UTF-8 sequences) of the names */
    gb_range *excl = malloc(sizeof *excl * (size_t)(n_names + 4));
    int n_excl = 0;
    if (!excl) { free(excl); gb_seq_free(&q); failf(c, DSV4_E_NOMEM, "out of memory%s%s", NULL, NULL); return -1; }
    excl[n_excl++] = (gb_range){ 0, 0x1F };
    excl[n_excl++] = (gb_range){ '"', '"' };
    excl[n_excl++] = (gb_range){ '\\', '\\' };
    if (c->lt) excl[n_excl++] = (gb_range){ '<', '<' };
    for (int i = 0; i < n_names; i++) {
        if (names[i].n == depth) continue;
        if (c->lt && names[i].s[depth] == '<') continue; /* no key with a raw '<' is written: nothing to avoid */
        const unsigned char *p = (const unsigned char *)names[i].s + depth;
        const int len = p[0] < 0x80 ? 1 : (p[0] >> 5) == 6 ? 2 : (p[0] >> 4) == 14 ? 3 : 4;
        uint32_t cp = len == 1 ? p[0] : len == 2 ? (p[0] & 31u) : len == 3 ? (p[0] & 15u) : (p[0] & 7u);
        for (int k = 1; k < len; k++) cp = (cp << 6) | (p[k] & 63u);
        int seen = 0;
        for (int j = 0; j < i; j++)
            if (names[j].n > depth && !memcmp(names[j].s + depth, p, (size_t)len)) seen = 1;
        if (seen) continue;
        excl[n_excl++] = (gb_range){ cp, cp };
        /* follow this branch: the names that continue with the same character */
        name *sub = malloc(sizeof *sub * (size_t)n_names);
        int n_sub = 0;
        if (!sub) { free(excl); gb_seq_free(&q); failf(c, DSV4_E_NOMEM, "out of memory%s%s", NULL, NULL); return -1; }
        for (int j = 0; j < n_names; j++)
            if (names[j].n >= depth + (size_t)len && !memcmp(names[j].s + depth, p, (size_t)len)) sub[n_sub++] = names[j];
        const int32_t child = other_key_node(c, sub, n_sub, depth + (size_t)len);
        free(sub);
        gb_seq_clear(&q);
        gb_seq_lit(&q, b, (const char *)p, (size_t)len);
        gb_seq_ref(&q, child);
        gb_add_alt(b, r, &q);
        /* excl grows by one per distinct character: at most n_names + 3 entries */
        if (n_excl >= n_names + 4) break;
    }
    /* leave the trie: a character that no name continues with, then any key characters */
    const int32_t leave = gb_class(b, excl, n_excl, 1);
    free(excl);
    if (leave >= 0) {
        gb_seq_clear(&q);
        gb_seq_ref(&q, leave);
        gb_seq_ref(&q, gb_repeat(b, c->r_keychar, 0, -1));
        gb_seq_byte(&q, b, '"');
        gb_add_alt(b, r, &q);
    }
    gb_seq_free(&q);
    return r;
}

static int32_t member_rule(sc *c, const char *key, int32_t value) {
    json_t *js = json_string(key);
    char *enc = js ? json_dumps(js, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(js);
    if (!enc) return failf(c, DSV4_E_ARG, "property name \"%s\" is not valid UTF-8%s", key, NULL);
    gb_seq q;
    gb_seq_init(&q);
    json_lit(c, &q, enc);
    free(enc);
    gb_seq_ref(&q, colon_rule(c));
    gb_seq_ref(&q, value);
    const int32_t r = gb_rule_of(c->b, &q);
    gb_seq_free(&q);
    return r;
}

static int32_t object_schema(sc *c, const json_t *s) {
    gb_builder *b = c->b;
    const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return failf(c, DSV4_E_ARG, "\"properties\" must be an object%s%s", NULL, NULL);
    if (req && !json_is_array(req)) return failf(c, DSV4_E_ARG, "\"required\" must be an array of names%s%s", NULL, NULL);
    size_t i;
    json_t *e;
    json_array_foreach(req, i, e)
        if (!json_is_string(e)) return failf(c, DSV4_E_ARG, "\"required\" must be an array of names%s%s", NULL, NULL);
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return failf(c, DSV4_E_ARG, "\"additionalProperties\" must be a boolean or a schema%s%s", NULL, NULL);
    /* members: properties in order, then required names not among them */
    const size_t np = props ? json_object_size(props) : 0, nr = req ? json_array_size(req) : 0;
    const char **key = calloc(np + nr + 1, sizeof *key);
    int32_t *mem = calloc(np + nr + 1, sizeof *mem);
    uint8_t *must = calloc(np + nr + 1, 1);
    name *names = calloc(np + nr + 1, sizeof *names);
    if (!key || !mem || !must || !names) {
        free(key); free(mem); free(must); free(names);
        return failf(c, DSV4_E_NOMEM, "out of memory%s%s", NULL, NULL);
    }
    size_t n = 0;
    const char *k;
    json_t *v;
    if (props)
        json_object_foreach((json_t *)props, k, v) {
            const size_t pl = path_push(c, "properties", k);
            const int32_t val = compile(c, v);
            path_pop(c, pl);
            if (val < 0) break;
            key[n] = k;
            mem[n++] = member_rule(c, k, val);
        }
    json_array_foreach(req, i, e) {
        const char *rk = json_string_value(e);
        size_t j = 0;
        while (j < n && strcmp(key[j], rk)) j++;
        if (j == n && !c->failed) { key[n] = rk; mem[n++] = member_rule(c, rk, value_rule(c)); }
        must[j] = 1;
    }
    int32_t extra = -1; /* schema of additional members, -1 = none */
    if (!c->failed) {
        if (addl ? json_is_true(addl) : !props) extra = value_rule(c);
        else if (addl && json_is_object(addl)) {
            const size_t pl = path_push(c, "additionalProperties", NULL);
            extra = compile(c, addl);
            path_pop(c, pl);
        }
    }
    int32_t result = -1;
    if (!c->failed) {
        const int32_t sep = sep_rule(c);
        gb_seq q, eps;
        gb_seq_init(&q);
        gb_seq_init(&eps);
        /* F_n / A_n: the additional members (first without a comma / after something, with one) */
        int32_t F = gb_rule_of(b, &eps), A = F;
        if (extra >= 0) {
            for (size_t j = 0; j < n; j++) {
                names[j] = (name){ key[j], strlen(key[j]) };
                /* the exclusion trie recurses once per byte of a name */
                if (names[j].n > 1024) {
                    failf(c, DSV4_E_UNSUPPORTED, "a property name longer than 1024 bytes beside additional properties%s%s", NULL, NULL);
                    break;
                }
            }
            if (c->failed) {
                gb_seq_free(&q);
                gb_seq_free(&eps);
                free(key); free(mem); free(must); free(names);
                return -1;
            }
            gb_seq_byte(&q, b, '"');
            gb_seq_ref(&q, other_key_node(c, names, (int)n, 0));
            gb_seq_ref(&q, colon_rule(c));
            gb_seq_ref(&q, extra);
            const int32_t xm = gb_rule_of(b, &q);
            gb_seq_clear(&q);
            gb_seq_ref(&q, sep);
            gb_seq_ref(&q, xm);
            A = gb_repeat(b, gb_rule_of(b, &q), 0, -1);
            F = gb_rule(b, NULL);
            gb_seq_clear(&q);
            gb_seq_ref(&q, xm);
            gb_seq_ref(&q, A);
            gb_add_alt(b, F, &q);
            gb_add_alt(b, F, &eps);
        }
        for (size_t j = n; j-- > 0;) {
            const int32_t nA = gb_rule(b, NULL), nF = gb_rule(b, NULL);
            gb_seq_clear(&q);
            gb_seq_ref(&q, sep);
            gb_seq_ref(&q, mem[j]);
            gb_seq_ref(&q, A);
            gb_add_alt(b, nA, &q);
            gb_seq_clear(&q);
            gb_seq_ref(&q, mem[j]);
            gb_seq_ref(&q, A);
            gb_add_alt(b, nF, &q);
            if (!must[j]) {
                gb_seq_clear(&q);
                gb_seq_ref(&q, A);
                gb_add_alt(b, nA, &q);
                gb_seq_clear(&q);
                gb_seq_ref(&q, F);
                gb_add_alt(b, nF, &q);
            }
            A = nA;
            F = nF;
        }
        gb_seq_clear(&q);
        gb_seq_byte(&q, b, '{');
        add_ws(c, &q);
        gb_seq_ref(&q, F);
        add_ws(c, &q);
        gb_seq_byte(&q, b, '}');
        result = gb_rule_of(b, &q);
        gb_seq_free(&q);
        gb_seq_free(&eps);
    }
    free(key); free(mem); free(must); free(names);
    return c->failed ? -1 : result;
}

/* enum / const: the values as compact JSON literals, those of the schema's types when "type" is given. */
static int value_has_type(const json_t *v, int types) {
    switch (json_typeof(v)) {
    case JSON_NULL: return types & T_NULL;
    case JSON_TRUE: case JSON_FALSE: return types & T_BOOL;
    case JSON_INTEGER: return types & (T_INT | T_NUM);
    case JSON_REAL: return (types & T_NUM) || ((types & T_INT) && json_real_value(v) == floor(json_real_value(v)));
    case JSON_STRING: return types & T_STR;
    case JSON_ARRAY: return types & T_ARR;
    case JSON_OBJECT: return types & T_OBJ;
    }
    return 0;
}

static int32_t enum_schema(sc *c, const json_t *s, int32_t r) {
    const json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en && cn) return failf(c, DSV4_E_UNSUPPORTED, "\"enum\" together with \"const\" is not supported%s%s", NULL, NULL);
    if (en && (!json_is_array(en) || json_array_size(en) == 0)) return failf(c, DSV4_E_ARG, "\"enum\" must be a non-empty array%s%s", NULL, NULL);
    const int types = json_object_get(s, "type") ? schema_types(c, s) : T_ALL;
    if (types < 0) return -1;
    const size_t n = en ? json_array_size(en) : 1;
    int any = 0;
    gb_seq q;
    gb_seq_init(&q);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = en ? json_array_get(en, i) : cn;
        if (!value_has_type(v, types)) continue;
        char *txt = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!txt) { gb_seq_free(&q); return failf(c, DSV4_E_NOMEM, "out of memory%s%s", NULL, NULL); }
        gb_seq_clear(&q);
        json_lit(c, &q, txt);
        free(txt);
        gb_add_alt(c->b, r, &q);
        any = 1;
    }
    gb_seq_free(&q);
    if (!any) return failf(c, DSV4_E_ARG, "no value of \"%s\" has the schema's type%s", en ? "enum" : "const", NULL);
    return r;
}

/* ---- $ref -------------------------------------------------------------------------------------------------- */

static const json_t *resolve_ref(sc *c, const char *ref) {
    if (ref[0] != '#') {
        failf(c, DSV4_E_UNSUPPORTED, "only local references (\"#...\") are supported, not \"%s\"%s", ref, NULL);
        return NULL;
    }
    const json_t *cur = c->root;
    const char *p = ref + 1;
    if (*p && *p != '/') { failf(c, DSV4_E_UNSUPPORTED, "reference \"%s\": only JSON pointers are supported%s", ref, NULL); return NULL; }
    char seg[256];
    while (*p == '/' && cur) {
        p++;
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof seg) {
            if (p[0] == '~' && p[1] == '0') { seg[n++] = '~'; p += 2; }
            else if (p[0] == '~' && p[1] == '1') { seg[n++] = '/'; p += 2; }
            else seg[n++] = *p++;
        }
        seg[n] = 0;
        if (json_is_object(cur)) cur = json_object_get(cur, seg);
        else if (json_is_array(cur)) {
            char *end;
            const long idx = strtol(seg, &end, 10);
            cur = *end || idx < 0 ? NULL : json_array_get(cur, (size_t)idx);
        } else cur = NULL;
    }
    if (!cur) failf(c, DSV4_E_ARG, "reference \"%s\" points to nothing%s", ref, NULL);
    return cur;
}

/* ---- one schema -------------------------------------------------------------------------------------------- */

static int memo_find(const sc *c, const json_t *s) {
    for (int i = 0; i < c->n_memo; i++)
        if (c->memo_key[i] == s) return c->memo_rule[i];
    return -1;
}

static int memo_add(sc *c, const json_t *s, int32_t r) {
    if (c->n_memo == c->cap_memo) {
        const int cap = c->cap_memo ? 2 * c->cap_memo : 32;
        const json_t **k = realloc(c->memo_key, sizeof *k * (size_t)cap);
        if (k) c->memo_key = k;
        int32_t *v = realloc(c->memo_rule, sizeof *v * (size_t)cap);
        if (v) c->memo_rule = v;
        if (!k || !v) return -1;
        c->cap_memo = cap;
    }
    c->memo_key[c->n_memo] = s;
    c->memo_rule[c->n_memo++] = r;
    return 0;
}

static void add_ref_alt(sc *c, int32_t r, int32_t target) {
    gb_seq q;
    gb_seq_init(&q);
    gb_seq_ref(&q, target);
    gb_add_alt(c->b, r, &q);
    gb_seq_free(&q);
}

/* Keywords other than annotations beside a combinator. */
static const char *other_keyword(const json_t *s, const char *const *allowed) {
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v) {
        if (is_annotation(k)) continue;
        int ok = 0;
        for (int i = 0; allowed[i]; i++) ok |= !strcmp(k, allowed[i]);
        if (!ok) return k;
    }
    return NULL;
}

static void compile_body(sc *c, const json_t *s, int32_t r) {
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)s, k, v)
        if (!is_annotation(k) && !find_kw(k)) { failf(c, DSV4_E_UNSUPPORTED, "unsupported keyword \"%s\"%s", k, NULL); return; }
    const json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        static const char *const only[] = { "$ref", NULL };
        const char *o = other_keyword(s, only);
        if (o) { failf(c, DSV4_E_UNSUPPORTED, "keyword \"%s\" beside \"$ref\" is not supported", o, NULL); return; }
        if (!json_is_string(ref)) { failf(c, DSV4_E_ARG, "\"$ref\" must be a string%s%s", NULL, NULL); return; }
        const json_t *t = resolve_ref(c, json_string_value(ref));
        if (!t) return;
        char saved[sizeof c->path];
        memcpy(saved, c->path, sizeof saved);
        snprintf(c->path, sizeof c->path, "%s", json_string_value(ref));
        const int32_t tr = compile(c, t);
        memcpy(c->path, saved, sizeof saved);
        if (tr >= 0) add_ref_alt(c, r, tr);
        return;
    }
    const char *comb = json_object_get(s, "anyOf") ? "anyOf" : json_object_get(s, "oneOf") ? "oneOf" : NULL;
    if (comb) {
        const char *const only[] = { comb, NULL };
        const char *o = other_keyword(s, only);
        if (o) { failf(c, DSV4_E_UNSUPPORTED, "keyword \"%s\" beside \"%s\" is not supported (move it into the alternatives)", o, comb); return; }
        const json_t *list = json_object_get(s, comb);
        if (!json_is_array(list) || json_array_size(list) == 0) { failf(c, DSV4_E_ARG, "\"%s\" must be a non-empty array%s", comb, NULL); return; }
        size_t i;
        json_t *e;
        json_array_foreach(list, i, e) {
            char idx[32];
            snprintf(idx, sizeof idx, "%zu", i);
            const size_t pl = path_push(c, comb, idx);
            const int32_t a = compile(c, e);
            path_pop(c, pl);
            if (a < 0) return;
            add_ref_alt(c, r, a);
        }
        return;
    }
    if (json_object_get(s, "enum") || json_object_get(s, "const")) {
        static const char *const only[] = { "enum", "const", "type", NULL };
        const char *o = other_keyword(s, only);
        if (o) { failf(c, DSV4_E_UNSUPPORTED, "keyword \"%s\" beside \"enum\"/\"const\" is not supported", o, NULL); return; }
        enum_schema(c, s, r);
        return;
    }
    const int types = schema_types(c, s);
    if (types < 0) return;
    /* every type-specific keyword must apply to one of the types (a keyword that constrains nothing would be
     * silently ignored) */
    json_object_foreach((json_t *)s, k, v) {
        const kw *w = find_kw(k);
        if (w && w->types && !(w->types & types)) {
            if (w->types == T_INT && (types & T_NUM))
                failf(c, DSV4_E_UNSUPPORTED, "\"%s\" is supported for integers only, not numbers", k, NULL);
            else failf(c, DSV4_E_ARG, "keyword \"%s\" does not apply to the schema's type%s", k, NULL);
            return;
        }
        if (w && w->types == T_INT && (types & T_NUM)) {
            failf(c, DSV4_E_UNSUPPORTED, "\"%s\" is supported for integers only, not numbers", k, NULL);
            return;
        }
    }
    int32_t alt[7];
    int n = 0;
    if (types & T_OBJ) alt[n++] = object_schema(c, s);
    if ((types & T_ARR) && !c->failed) alt[n++] = array_schema(c, s);
    if ((types & T_STR) && !c->failed) alt[n++] = string_schema(c, s);
    if ((types & T_NUM) && !c->failed) alt[n++] = number_rule(c);
    else if ((types & T_INT) && !c->failed) alt[n++] = integer_schema(c, s);
    if ((types & T_BOOL) && !c->failed) { alt[n++] = lit_rule(c, "true"); alt[n++] = lit_rule(c, "false"); }
    if ((types & T_NULL) && !c->failed) alt[n++] = lit_rule(c, "null");
    for (int i = 0; i < n && !c->failed; i++) add_ref_alt(c, r, alt[i]);
}

static int32_t compile(sc *c, const json_t *s) {
    if (c->failed) return -1;
    if (json_is_true(s)) return value_rule(c);
    if (json_is_false(s)) return failf(c, DSV4_E_ARG, "the schema false allows no value%s%s", NULL, NULL);
    if (!json_is_object(s)) return failf(c, DSV4_E_ARG, "a schema must be an object or a boolean%s%s", NULL, NULL);
    const int32_t m = memo_find(c, s);
    if (m >= 0) return m;
    const int32_t r = gb_rule(c->b, c->path);
    if (r < 0 || memo_add(c, s, r)) return failf(c, DSV4_E_NOMEM, "out of memory%s%s", NULL, NULL);
    compile_body(c, s, r);
    return c->failed ? -1 : r;
}

static void sc_init(sc *c, const dsv4_schema_opts *o, dsv4_error *err) {
    memset(c, 0, sizeof *c);
    c->path[0] = '#'; /* error locations are JSON pointers into the schema */
    c->max_ws = o ? o->max_ws : DSV4_SCHEMA_DEFAULT_WS;
    c->lt = o ? o->lt_escaped : 0;
    c->err = err;
    c->r_ws = c->r_sep = c->r_colon = c->r_char = c->r_string = c->r_number = c->r_integer = c->r_value = c->r_keychar = -1;
}

static int sc_finish(sc *c, int32_t root, dsv4_grammar **out) {
    free(c->memo_key);
    free(c->memo_rule);
    if (c->failed) { gb_free(c->b); return c->err ? c->err->code : DSV4_E_ARG; }
    if (!c->b) return dsv4_fail(c->err, DSV4_E_NOMEM, "json schema: out of memory");
    const int rc = gb_finish(c->b, root, out, c->err);
    if (rc) dsv4_wrap(c->err, "json schema");
    return rc;
}

int dsv4_grammar_from_schema(const json_t *schema, const dsv4_schema_opts *o, dsv4_grammar **out, dsv4_error *err) {
    *out = NULL;
    if (o && (o->max_ws < 0 || o->max_ws > 64)) return dsv4_fail(err, DSV4_E_ARG, "json schema: whitespace limit must be 0..64");
    sc c;
    sc_init(&c, o, err);
    c.root = schema;
    c.b = gb_new();
    const int32_t root = c.b ? compile(&c, schema) : -1;
    return sc_finish(&c, root, out);
}

int dsv4_grammar_from_schema_text(const char *text, size_t n, const dsv4_schema_opts *o, dsv4_grammar **out,
                                  dsv4_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *j = json_loadb(text, n, JSON_DECODE_ANY, &je);
    if (!j) return dsv4_fail(err, DSV4_E_FORMAT, "json schema: not JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    const int rc = dsv4_grammar_from_schema(j, o, out, err);
    json_decref(j);
    return rc;
}

int dsv4_grammar_json_any(const dsv4_schema_opts *o, dsv4_grammar **out, dsv4_error *err) {
    *out = NULL;
    if (o && (o->max_ws < 0 || o->max_ws > 64)) return dsv4_fail(err, DSV4_E_ARG, "json schema: whitespace limit must be 0..64");
    sc c;
    sc_init(&c, o, err);
    c.b = gb_new();
    const int32_t root = c.b ? value_rule(&c) : -1;
    return sc_finish(&c, root, out);
}

int32_t dsv4_schema_rule(gb_builder *b, const json_t *root, const json_t *schema, const dsv4_schema_opts *o,
                         const char *where, dsv4_error *err) {
    if (o && (o->max_ws < 0 || o->max_ws > 64)) { dsv4_fail(err, DSV4_E_ARG, "json schema: whitespace limit must be 0..64"); return -1; }
    sc c;
    sc_init(&c, o, err);
    if (where) snprintf(c.path, sizeof c.path, "%s", where);
    c.root = root;
    c.b = b;
    const int32_t r = schema ? compile(&c, schema) : value_rule(&c);
    free(c.memo_key);
    free(c.memo_rule);
    if (c.failed) return -1;
    if (r < 0 || gb_oom(b)) { dsv4_fail(err, DSV4_E_NOMEM, "json schema: out of memory"); return -1; }
    return r;
}
