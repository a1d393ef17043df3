/* Grammar builder and checks: see grammar_ir.h. */
#include "engine/grammar_ir.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

#define INF_LEN ((int64_t)1 << 60)

typedef struct { int32_t rule, start, len; } galt;

typedef struct {
    gb_range *r;     /* normalized ranges (owned) */
    int n;
    int32_t rule;
} class_entry;

struct gb_builder {
    gelem *el;       /* bodies of all alternatives, concatenated (no GE_END yet) */
    int64_t n_el, cap_el;
    galt *alt;
    int64_t n_alt, cap_alt;
    char **name;
    uint8_t *defined;
    int32_t n_rule, cap_rule;
    gb_set *sets;
    int32_t n_sets, cap_sets;
    class_entry *cls;
    int n_cls, cap_cls;
    char **special;
    int32_t n_special;
    int64_t cap_special;
    int oom;
};

/* Grow *p (element size sz) so that it holds need entries. */
static int grow(void **p, int64_t *cap, int64_t need, size_t sz) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * sz);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* ---- sequences ------------------------------------------------------------------------------------------- */

void gb_seq_init(gb_seq *s) { memset(s, 0, sizeof *s); }
void gb_seq_free(gb_seq *s) { free(s->v); memset(s, 0, sizeof *s); }
void gb_seq_clear(gb_seq *s) { s->n = 0; }

static void seq_push(gb_seq *s, int32_t kind, int32_t arg) {
    if (s->n == s->cap) {
        int c = s->cap ? 2 * s->cap : 8;
        gelem *v = realloc(s->v, sizeof *v * (size_t)c);
        if (!v) { s->oom = 1; return; }
        s->v = v;
        s->cap = c;
    }
    s->v[s->n++] = (gelem){ kind, arg };
}

void gb_seq_ref(gb_seq *s, int32_t rule) {
    if (rule < 0) { s->oom = 1; return; }
    seq_push(s, GE_RULE, rule);
}

/* Index of the set in the builder's table (identical sets share one entry), -1 when out of memory. */
static int32_t intern_set(gb_builder *b, const gb_set *set) {
    for (int32_t i = b->n_sets - 1; i >= 0 && i >= b->n_sets - 256; i--)
        if (!memcmp(&b->sets[i], set, sizeof *set)) return i;
    int64_t cap = b->cap_sets;
    if (grow((void **)&b->sets, &cap, b->n_sets + 1, sizeof *b->sets)) { b->oom = 1; return -1; }
    b->cap_sets = (int32_t)cap;
    b->sets[b->n_sets] = *set;
    return b->n_sets++;
}

void gb_seq_set(gb_seq *s, gb_builder *b, const gb_set *set) {
    const int32_t i = intern_set(b, set);
    if (i < 0) { s->oom = 1; return; }
    seq_push(s, GE_BYTES, i);
}

void gb_seq_byte(gb_seq *s, gb_builder *b, unsigned char c) {
    gb_set set = {{0}};
    gb_set_add(&set, c);
    gb_seq_set(s, b, &set);
}

void gb_seq_lit(gb_seq *s, gb_builder *b, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) gb_seq_byte(s, b, (unsigned char)bytes[i]);
}

void gb_seq_append(gb_seq *s, const gb_seq *t) {
    if (t->oom) s->oom = 1;
    for (int i = 0; i < t->n; i++) seq_push(s, t->v[i].kind, t->v[i].arg);
}

void gb_seq_special(gb_seq *s, gb_builder *b, const char *text) {
    int32_t k = 0;
    while (k < b->n_special && strcmp(b->special[k], text)) k++;
    if (k == b->n_special) {
        char *t = strdup(text);
        if (!t || grow((void **)&b->special, &b->cap_special, b->n_special + 1, sizeof *b->special)) {
            free(t);
            b->oom = 1;
            s->oom = 1;
            return;
        }
        b->special[b->n_special++] = t;
    }
    seq_push(s, GE_TOKEN, k);
}

/* ---- rules ----------------------------------------------------------------------------------------------- */

gb_builder *gb_new(void) { return calloc(1, sizeof(gb_builder)); }

void gb_free(gb_builder *b) {
    if (!b) return;
    for (int32_t i = 0; i < b->n_rule; i++) free(b->name[i]);
    for (int i = 0; i < b->n_cls; i++) free(b->cls[i].r);
    for (int32_t i = 0; i < b->n_special; i++) free(b->special[i]);
    free(b->special);
    free(b->cls);
    free(b->name);
    free(b->defined);
    free(b->el);
    free(b->alt);
    free(b->sets);
    free(b);
}

int gb_oom(const gb_builder *b) { return b->oom; }

int32_t gb_rule(gb_builder *b, const char *name) {
    int64_t cap = b->cap_rule, cap2 = b->cap_rule;
    if (grow((void **)&b->name, &cap, b->n_rule + 1, sizeof *b->name) ||
        grow((void **)&b->defined, &cap2, b->n_rule + 1, 1)) { b->oom = 1; return -1; }
    b->cap_rule = (int32_t)(cap < cap2 ? cap : cap2);
    char *nm = NULL;
    if (name && *name && !(nm = strdup(name))) { b->oom = 1; return -1; }
    b->name[b->n_rule] = nm;
    b->defined[b->n_rule] = 0;
    return b->n_rule++;
}

int32_t gb_rule_named(gb_builder *b, const char *name) {
    for (int32_t i = 0; i < b->n_rule; i++)
        if (b->name[i] && !strcmp(b->name[i], name)) return i;
    return gb_rule(b, name);
}

int gb_rule_defined(const gb_builder *b, int32_t rule) { return rule >= 0 && rule < b->n_rule && b->defined[rule]; }
const char *gb_rule_name(const gb_builder *b, int32_t rule) {
    return rule >= 0 && rule < b->n_rule && b->name[rule] ? b->name[rule] : "(anonymous)";
}

void gb_add_alt(gb_builder *b, int32_t rule, const gb_seq *s) {
    if (rule < 0 || s->oom) { b->oom = 1; return; }
    if (grow((void **)&b->el, &b->cap_el, b->n_el + s->n, sizeof *b->el) ||
        grow((void **)&b->alt, &b->cap_alt, b->n_alt + 1, sizeof *b->alt)) { b->oom = 1; return; }
    if (s->n) memcpy(b->el + b->n_el, s->v, sizeof *s->v * (size_t)s->n);
    b->alt[b->n_alt++] = (galt){ rule, (int32_t)b->n_el, s->n };
    b->n_el += s->n;
    b->defined[rule] = 1;
}

int32_t gb_rule_of(gb_builder *b, const gb_seq *s) {
    const int32_t r = gb_rule(b, NULL);
    gb_add_alt(b, r, s);
    return r;
}

int32_t gb_repeat(gb_builder *b, int32_t x, int64_t min, int64_t max) {
    if (x < 0 || min < 0 || min > GB_MAX_REPEAT || max > GB_MAX_REPEAT || (max >= 0 && max < min)) { b->oom = 1; return -1; }
    gb_seq s, e;
    gb_seq_init(&s);
    gb_seq_init(&e);
    int32_t tail = -1;
    if (max < 0) {
        /* L ::= x L | empty: right recursion, which the matcher runs in constant stack depth */
        tail = gb_rule(b, NULL);
        gb_seq_ref(&s, x);
        gb_seq_ref(&s, tail);
        gb_add_alt(b, tail, &s);
        gb_add_alt(b, tail, &e);
    } else {
        /* O_k ::= x O_{k+1} | empty, built from the end so each rule refers to an earlier one */
        for (int64_t k = 0; k < max - min; k++) {
            const int32_t o = gb_rule(b, NULL);
            gb_seq_clear(&s);
            gb_seq_ref(&s, x);
            if (tail >= 0) gb_seq_ref(&s, tail);
            gb_add_alt(b, o, &s);
            gb_add_alt(b, o, &e);
            tail = o;
        }
    }
    gb_seq_clear(&s);
    for (int64_t k = 0; k < min; k++) gb_seq_ref(&s, x);
    if (tail >= 0) gb_seq_ref(&s, tail);
    const int32_t r = gb_rule_of(b, &s);
    gb_seq_free(&s);
    gb_seq_free(&e);
    return r;
}

/* ---- character classes ---------------------------------------------------------------------------------- */

static int range_cmp(const void *a, const void *b) {
    const gb_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sort and merge; complement over the scalar values when negate; cut out the surrogates. *out is malloc'd. */
static int normalize(const gb_range *r, int n, int negate, gb_range **out, int *n_out) {
    gb_range *t = malloc(sizeof *t * (size_t)(n + 2) * 2);
    if (!t) return -1;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (r[i].lo <= r[i].hi && r[i].lo <= 0x10FFFF) t[m++] = (gb_range){ r[i].lo, r[i].hi > 0x10FFFF ? 0x10FFFF : r[i].hi };
    qsort(t, (size_t)m, sizeof *t, range_cmp);
    int k = 0;
    for (int i = 0; i < m; i++) {
        if (k && t[i].lo <= t[k - 1].hi + 1) { if (t[i].hi > t[k - 1].hi) t[k - 1].hi = t[i].hi; }
        else t[k++] = t[i];
    }
    gb_range *u = malloc(sizeof *u * (size_t)(k + 2) * 2);
    if (!u) { free(t); return -1; }
    int q = 0;
    if (negate) {
        uint32_t next = 0;
        for (int i = 0; i < k; i++) {
            if (t[i].lo > next) u[q++] = (gb_range){ next, t[i].lo - 1 };
            next = t[i].hi + 1;
        }
        if (next <= 0x10FFFF) u[q++] = (gb_range){ next, 0x10FFFF };
    } else {
        memcpy(u, t, sizeof *t * (size_t)k);
        q = k;
    }
    free(t);
    /* remove D800..DFFF */
    gb_range *v = malloc(sizeof *v * (size_t)(q + 1) * 2);
    if (!v) { free(u); return -1; }
    int w = 0;
    for (int i = 0; i < q; i++) {
        if (u[i].hi < 0xD800 || u[i].lo > 0xDFFF) { v[w++] = u[i]; continue; }
        if (u[i].lo < 0xD800) v[w++] = (gb_range){ u[i].lo, 0xD7FF };
        if (u[i].hi > 0xDFFF) v[w++] = (gb_range){ 0xE000, u[i].hi };
    }
    free(u);
    *out = v;
    *n_out = w;
    return 0;
}

static int utf8_encode(uint32_t c, unsigned char *o) {
    if (c < 0x80) { o[0] = (unsigned char)c; return 1; }
    if (c < 0x800) { o[0] = (unsigned char)(0xC0 | (c >> 6)); o[1] = (unsigned char)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (c >> 12));
        o[1] = (unsigned char)(0x80 | ((c >> 6) & 63));
        o[2] = (unsigned char)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (c >> 18));
    o[1] = (unsigned char)(0x80 | ((c >> 12) & 63));
    o[2] = (unsigned char)(0x80 | ((c >> 6) & 63));
    o[3] = (unsigned char)(0x80 | (c & 63));
    return 4;
}

/* Add alternatives to rule r matching the UTF-8 encodings of the multi-byte code points lo..hi: split the range
 * until every byte position of the encoding is one contiguous byte range (then one byte-set sequence). */
static void utf8_split(gb_builder *b, int32_t r, uint32_t lo, uint32_t hi) {
    if (lo > hi) return;
    static const uint32_t edge[3] = { 0x7F, 0x7FF, 0xFFFF };
    for (int i = 0; i < 3; i++)
        if (lo <= edge[i] && edge[i] < hi) {
            utf8_split(b, r, lo, edge[i]);
            utf8_split(b, r, edge[i] + 1, hi);
            return;
        }
    unsigned char a[4], z[4];
    const int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        const uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) { utf8_split(b, r, lo, lo | m); utf8_split(b, r, (lo | m) + 1, hi); return; }
            if ((hi & m) != m) { utf8_split(b, r, lo, (hi & ~m) - 1); utf8_split(b, r, hi & ~m, hi); return; }
        }
    }
    utf8_encode(hi, z);
    gb_seq s;
    gb_seq_init(&s);
    for (int i = 0; i < n; i++) {
        gb_set set = {{0}};
        for (unsigned c = a[i]; c <= z[i]; c++) gb_set_add(&set, c);
        gb_seq_set(&s, b, &set);
    }
    gb_add_alt(b, r, &s);
    gb_seq_free(&s);
}

int32_t gb_class(gb_builder *b, const gb_range *r, int n, int negate) {
    gb_range *v;
    int m;
    if (normalize(r, n, negate, &v, &m)) { b->oom = 1; return -1; }
    if (m == 0) { free(v); return -1; }
    for (int i = 0; i < b->n_cls; i++)
        if (b->cls[i].n == m && !memcmp(b->cls[i].r, v, sizeof *v * (size_t)m)) { free(v); return b->cls[i].rule; }
    const int32_t rule = gb_rule(b, NULL);
    gb_set ascii = {{0}};
    int any_ascii = 0;
    for (int i = 0; i < m; i++) {
        for (uint32_t c = v[i].lo; c <= v[i].hi && c < 0x80; c++) { gb_set_add(&ascii, c); any_ascii = 1; }
        const uint32_t lo = v[i].lo < 0x80 ? 0x80 : v[i].lo;
        if (v[i].hi >= 0x80) utf8_split(b, rule, lo, v[i].hi);
    }
    if (any_ascii) {
        gb_seq s;
        gb_seq_init(&s);
        gb_seq_set(&s, b, &ascii);
        gb_add_alt(b, rule, &s);
        gb_seq_free(&s);
    }
    int64_t cap = b->cap_cls;
    if (grow((void **)&b->cls, &cap, b->n_cls + 1, sizeof *b->cls)) { free(v); b->oom = 1; return -1; }
    b->cap_cls = (int)cap;
    b->cls[b->n_cls++] = (class_entry){ v, m, rule };
    return rule;
}

/* ---- finishing --------------------------------------------------------------------------------------------- */

static void *dup_mem(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

static char *dup_str(const char *s) { return s ? dup_mem(s, strlen(s) + 1) : NULL; }

dsv4_grammar *dsv4_grammar_copy(const dsv4_grammar *g) {
    dsv4_grammar *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = *g;
    c->el = dup_mem(g->el, sizeof *g->el * (size_t)g->n_el);
    c->alt_first = dup_mem(g->alt_first, sizeof *g->alt_first * (size_t)(g->n_rule + 1));
    c->alt_pos = dup_mem(g->alt_pos, sizeof *g->alt_pos * (size_t)g->alt_first[g->n_rule]);
    c->sets = dup_mem(g->sets, sizeof *g->sets * (size_t)g->n_sets);
    c->minrest = dup_mem(g->minrest, sizeof *g->minrest * (size_t)g->n_el);
    c->rule_min = dup_mem(g->rule_min, sizeof *g->rule_min * (size_t)g->n_rule);
    c->rule_name = calloc((size_t)g->n_rule + 1, sizeof *c->rule_name);
    c->special = calloc((size_t)g->n_special + 1, sizeof *c->special);
    int ok = c->el && c->alt_first && c->alt_pos && c->sets && c->minrest && c->rule_min && c->rule_name && c->special;
    for (int32_t i = 0; ok && i < g->n_rule; i++)
        if (g->rule_name[i] && !(c->rule_name[i] = dup_str(g->rule_name[i]))) ok = 0;
    for (int32_t i = 0; ok && i < g->n_special; i++)
        if (!(c->special[i] = dup_str(g->special[i]))) ok = 0;
    if (!ok) {
        /* free what was copied: the counts say how far the name lists go, NULL entries are fine */
        if (!c->rule_name) c->n_rule = 0;
        if (!c->special) c->n_special = 0;
        dsv4_grammar_free(c);
        return NULL;
    }
    return c;
}

int dsv4_grammar_same(const dsv4_grammar *a, const dsv4_grammar *b) {
    if (a->n_el != b->n_el || a->n_rule != b->n_rule || a->n_sets != b->n_sets || a->root != b->root ||
        a->n_special != b->n_special || a->alt_first[a->n_rule] != b->alt_first[b->n_rule])
        return 0;
    if (memcmp(a->el, b->el, sizeof *a->el * (size_t)a->n_el) ||
        memcmp(a->alt_first, b->alt_first, sizeof *a->alt_first * (size_t)(a->n_rule + 1)) ||
        memcmp(a->alt_pos, b->alt_pos, sizeof *a->alt_pos * (size_t)a->alt_first[a->n_rule]) ||
        memcmp(a->sets, b->sets, sizeof *a->sets * (size_t)a->n_sets))
        return 0;
    for (int32_t i = 0; i < a->n_special; i++)
        if (strcmp(a->special[i], b->special[i])) return 0;
    return 1;
}

static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ULL;
    return h;
}

uint64_t dsv4_grammar_hash(const dsv4_grammar *g) {
    uint64_t h = 0xcbf29ce484222325ULL;
    h = fnv_bytes(h, g->el, sizeof *g->el * (size_t)g->n_el);
    h = fnv_bytes(h, g->alt_pos, sizeof *g->alt_pos * (size_t)g->alt_first[g->n_rule]);
    h = fnv_bytes(h, g->sets, sizeof *g->sets * (size_t)g->n_sets);
    for (int32_t i = 0; i < g->n_special; i++) h = fnv_bytes(h, g->special[i], strlen(g->special[i]));
    return h ^ (uint64_t)(uint32_t)g->root << 32 ^ (uint64_t)(uint32_t)g->n_rule;
}

void dsv4_grammar_free(dsv4_grammar *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->n_rule; i++) free(g->rule_name[i]);
    free(g->rule_name);
    for (int32_t i = 0; i < g->n_special; i++) free(g->special[i]);
    free(g->special);
    free(g->el);
    free(g->alt_first);
    free(g->alt_pos);
    free(g->sets);
    free(g->minrest);
    free(g->rule_min);
    free(g);
}

static int64_t elem_min(const dsv4_grammar *g, gelem e) {
    return e.kind == GE_BYTES || e.kind == GE_TOKEN ? 1 : e.kind == GE_RULE ? g->rule_min[e.arg] : 0;
}

/* Left recursion would make the matcher expand a rule into itself forever without reading a byte: find a cycle
 * in the "can start with" graph (through nullable prefixes). Iterative DFS: grammars may have long chains. */
static int check_left_recursion(const dsv4_grammar *g, const uint8_t *nullable, dsv4_error *err) {
    const int32_t R = g->n_rule;
    uint8_t *color = calloc((size_t)R, 1);
    int32_t *stack = malloc(sizeof(int32_t) * (size_t)R * 2);
    if (!color || !stack) { free(color); free(stack); return dsv4_fail(err, DSV4_E_NOMEM, "grammar: out of memory"); }
    int rc = 0;
    for (int32_t s0 = 0; s0 < R && !rc; s0++) {
        if (color[s0]) continue;
        /* stack of (rule, next alternative-element cursor) pairs; the cursor walks a flattened list of the
         * rule's left-corner references */
        stack[0] = s0;
        stack[1] = 0;
        color[s0] = 1;
        int top = 1;
        while (top > 0 && !rc) {
            const int32_t r = stack[2 * (top - 1)];
            int32_t *cur = &stack[2 * (top - 1) + 1];
            /* the cursor counts left-corner references seen so far in r's alternatives */
            int32_t seen = 0, next = -1;
            for (int32_t a = g->alt_first[r]; a < g->alt_first[r + 1] && next < 0; a++)
                for (int32_t p = g->alt_pos[a]; g->el[p].kind == GE_RULE; p++) {
                    if (seen++ == *cur) { next = g->el[p].arg; break; }
                    if (!nullable[g->el[p].arg]) break;
                }
            if (next < 0) { color[r] = 2; top--; continue; }
            (*cur)++;
            if (color[next] == 1) {
                rc = dsv4_fail(err, DSV4_E_ARG, "grammar: rule '%s' is left-recursive (it can start with itself)",
                               g->rule_name[next] ? g->rule_name[next] : "(anonymous)");
            } else if (color[next] == 0) {
                color[next] = 1;
                stack[2 * top] = next;
                stack[2 * top + 1] = 0;
                top++;
            }
        }
    }
    free(color);
    free(stack);
    return rc;
}

int gb_finish(gb_builder *b, int32_t root, dsv4_grammar **out, dsv4_error *err) {
    *out = NULL;
    int rc = 0;
    dsv4_grammar *g = NULL;
    uint8_t *nullable = NULL;
    if (b->oom) { rc = dsv4_fail(err, DSV4_E_NOMEM, "grammar: out of memory"); goto done; }
    if (root < 0 || root >= b->n_rule || !b->defined[root]) { rc = dsv4_fail(err, DSV4_E_ARG, "grammar: no root rule"); goto done; }
    for (int64_t i = 0; i < b->n_el; i++)
        if (b->el[i].kind == GE_RULE && !b->defined[b->el[i].arg]) {
            rc = dsv4_fail(err, DSV4_E_ARG, "grammar: rule '%s' is used but never defined", gb_rule_name(b, b->el[i].arg));
            goto done;
        }
    if (b->n_el + b->n_alt > (int64_t)1 << 30) { rc = dsv4_fail(err, DSV4_E_ARG, "grammar: too large"); goto done; }
    g = calloc(1, sizeof *g);
    if (!g) { rc = dsv4_fail(err, DSV4_E_NOMEM, "grammar: out of memory"); goto done; }
    const int32_t R = b->n_rule;
    g->n_rule = R;
    g->root = root;
    g->n_el = (int32_t)(b->n_el + b->n_alt);
    g->el = malloc(sizeof *g->el * (size_t)g->n_el);
    g->alt_first = calloc((size_t)R + 1, sizeof *g->alt_first);
    g->alt_pos = malloc(sizeof *g->alt_pos * (size_t)(b->n_alt + 1));
    g->sets = malloc(sizeof *g->sets * (size_t)(b->n_sets + 1));
    g->minrest = malloc(sizeof *g->minrest * (size_t)g->n_el);
    g->rule_min = malloc(sizeof *g->rule_min * (size_t)R);
    g->rule_name = calloc((size_t)R, sizeof *g->rule_name);
    nullable = calloc((size_t)R, 1);
    if (!g->el || !g->alt_first || !g->alt_pos || !g->sets || !g->minrest || !g->rule_min || !g->rule_name || !nullable) {
        rc = dsv4_fail(err, DSV4_E_NOMEM, "grammar: out of memory");
        goto done;
    }
    if (b->n_sets) memcpy(g->sets, b->sets, sizeof *g->sets * (size_t)b->n_sets);
    g->n_sets = b->n_sets;
    for (int32_t r = 0; r < R; r++) { g->rule_name[r] = b->name[r]; b->name[r] = NULL; }
    g->special = b->special;
    g->n_special = b->n_special;
    b->special = NULL;
    b->n_special = 0;
    /* flatten: rules in id order, each rule's alternatives in the order they were added */
    for (int64_t a = 0; a < b->n_alt; a++) g->alt_first[b->alt[a].rule + 1]++;
    for (int32_t r = 0; r < R; r++) g->alt_first[r + 1] += g->alt_first[r];
    int32_t *fill = malloc(sizeof *fill * (size_t)(R + 1));
    int64_t *order = malloc(sizeof *order * (size_t)(b->n_alt + 1));
    if (!fill || !order) { free(fill); free(order); rc = dsv4_fail(err, DSV4_E_NOMEM, "grammar: out of memory"); goto done; }
    memcpy(fill, g->alt_first, sizeof *fill * (size_t)R);
    for (int64_t a = 0; a < b->n_alt; a++) order[fill[b->alt[a].rule]++] = a;
    int32_t pos = 0;
    for (int64_t k = 0; k < b->n_alt; k++) {
        const galt *al = &b->alt[order[k]];
        g->alt_pos[k] = pos;
        if (al->len) memcpy(g->el + pos, b->el + al->start, sizeof *g->el * (size_t)al->len);
        pos += al->len;
        g->el[pos++] = (gelem){ GE_END, 0 };
    }
    free(fill);
    free(order);
    /* nullable rules (fixpoint) */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t r = 0; r < R; r++) {
            if (nullable[r]) continue;
            for (int32_t a = g->alt_first[r]; a < g->alt_first[r + 1]; a++) {
                int32_t p = g->alt_pos[a];
                while (g->el[p].kind == GE_RULE && nullable[g->el[p].arg]) p++;
                if (g->el[p].kind == GE_END) { nullable[r] = 1; changed = 1; break; }
            }
        }
    }
    if ((rc = check_left_recursion(g, nullable, err))) goto done;
    /* shortest expansion of every rule: relax in alternating order until stable (chains built in either
     * direction settle in a few passes) */
    for (int32_t r = 0; r < R; r++) g->rule_min[r] = INF_LEN;
    int pass = 0;
    for (int changed = 1; changed; pass++) {
        changed = 0;
        if (pass > 100000) { rc = dsv4_fail(err, DSV4_E_ARG, "grammar: too deeply nested"); goto done; }
        for (int32_t k = 0; k < R; k++) {
            const int32_t r = pass & 1 ? R - 1 - k : k;
            for (int32_t a = g->alt_first[r]; a < g->alt_first[r + 1]; a++) {
                int64_t sum = 0;
                for (int32_t p = g->alt_pos[a]; g->el[p].kind != GE_END && sum < INF_LEN; p++) sum += elem_min(g, g->el[p]);
                if (sum > INF_LEN) sum = INF_LEN;
                if (sum < g->rule_min[r]) { g->rule_min[r] = sum; changed = 1; }
            }
        }
    }
    for (int32_t r = 0; r < R; r++)
        if (g->alt_first[r + 1] > g->alt_first[r] && g->rule_min[r] >= INF_LEN) {
            rc = dsv4_fail(err, DSV4_E_ARG, "grammar: rule '%s' can never finish (every alternative recurses forever)",
                           g->rule_name[r] ? g->rule_name[r] : "(anonymous)");
            goto done;
        }
    for (int32_t a = 0; a < g->alt_first[R]; a++) {
        int32_t end = g->alt_pos[a];
        while (g->el[end].kind != GE_END) end++;
        g->minrest[end] = 0;
        for (int32_t p = end - 1; p >= g->alt_pos[a]; p--) g->minrest[p] = elem_min(g, g->el[p]) + g->minrest[p + 1];
    }
    *out = g;
    g = NULL;
done:
    free(nullable);
    dsv4_grammar_free(g);
    gb_free(b);
    return rc;
}
