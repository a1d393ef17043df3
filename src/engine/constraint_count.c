/* Closed forms for the masks of counted repetitions: a string with r characters left before its maxLength,
 * x{1,300} at count k, the characters of an extra key. No trie walk: a table lookup and a few uncertain tokens.
 *
 * Why. Each count of a counted repetition is its own configuration, and near the bound its walk differs from
 * every stored one (constraint_sig.c) exactly for the tokens that are longer than what is left: a trie walk
 * of 90k-270k nodes (1-3 ms) per count on the real vocabulary, on the first request with a schema.
 *
 * The shape. gb_repeat builds x{min,max} as min references to x followed by a chain of rules
 * O ::= x O' | empty (O' the next rule of the chain; the last one is x alone; an unbounded x* is one rule that
 * refers to itself), wrapped in a rule of one alternative `x ... x O` (a counted sequence). A frame F = (q, P)
 * pushed by a reference to x says "after this x, continue at position q, then with the frames P". Following
 * the grammar from q: references to x (each a mandatory x) and to counted sequences of x, up to the first
 * chain (optional x's), then the continuation K = (position after them, P). So after the x now in progress,
 * between p and R more x's may come, then K. Here x must not be nullable.
 *
 * A truncated configuration tc (constraint.c) at the start of an x has the form
 *     tc = Xs(F) + E0,
 * Xs(F) being the closure of x's alternatives with the frame F, and E0 whatever else tc has (the closing quote
 * when the string may end now, the empty key's quote). Both are built here (pda_enter) and compared with tc by
 * id, so the form is never assumed: tc contains Xs(F) exactly, or this file does nothing. When every stack
 * passes through F (the first, mandatory characters), the truncation cuts F's continuation off and K would
 * escape; constraint.c then asks for the form of the real configuration, whose answer it keeps for it alone.
 *
 * The table of x (per vocabulary, independent of the frames). Let S = Xs(WILD), x started with nothing below.
 * Reading a token's bytes from S, resetting to S each time the x is complete (the configuration escaped, with
 * nothing else alive: x must be prefix-free, or there is no table), classifies every token:
 *   pure:  all its bytes are x content; c = the x's started (the last one maybe unfinished, needing `rest` more
 *          bytes to complete);
 *   break: after j complete x's the next byte b cannot start an x;
 *   dead:  it stops inside an x.
 * That is one walk of the trie per x (pure prefixes and their children only). An x that is one byte of a set
 * (a character class of single bytes: GBNF and pattern classes) needs no walk: pure tokens are those whose
 * bytes are all in the set (the vocabulary's per-byte token sets, constraint_vocab.h), c is their length, and
 * the breaks at a byte are found when a mask first needs them. The vocabulary keeps the tables of JSON's
 * string characters and key characters (dsv4_cvocab_prepare_json, ~25 ms at load); a matcher finds them by
 * comparing rules structurally (the same rules match the same bytes), and makes its own for other x's, once
 * per x (when the probe of constraint_sig.c finds the configuration wide).
 *
 * The closed form. With FirstX = the bytes that start an x, FirstE0 / FirstK = the bytes E0 / K read (K's
 * closure built from F and the count shape above), if FirstX meets neither and K does not escape (leave the
 * truncated frames without reading a byte), then at the j-th boundary of a token (after j complete x's, from
 * tc) the configuration is: x's that may continue (if j - 1 < R) plus K (if p <= j - 1 <= R), plus E0 at j = 0.
 * A byte of FirstX continues the x's only (the other stacks die), a byte outside it the other stacks only. So:
 *   allowed whatever the context: pure tokens with c <= R + 1 (their x stacks are alive at the end);
 *   uncertain (checked alone against the real configuration, constraint.c): break tokens with j = 0 and b in
 *     FirstE0, and with p + 1 <= j <= R + 1 and b in FirstK;
 *   refused: everything else (pure with c > R + 1: x cannot continue and K does not read FirstX; break tokens
 *     elsewhere; dead tokens: inside an x only x's stacks are alive, and they are above F).
 * need (the budget this holds for) is bounded by the longest pure token's length plus its rest, plus p + 1
 * shortest x's, plus K's shortest completion: the completion of the pure stack, at least the configuration's.
 * Below that budget (the end of a length bound), count_budget keeps the allowed tokens that still fit, one by
 * one: after a pure token only its x stack is alive, so that completion is exactly the configuration's.
 *
 * Not handled (a walk as before): the last x of a chain (`x` alone, no frame: one character left), positions
 * inside an x, and an x followed by bytes of x (the checks above).
 *
 * Exactness: tests/unit/test_constraint_count.c checks every mask against each token's own answer on counted
 * strings at every count, escapes, UTF-8 pieces, closing quotes followed by other bytes, extra keys and GBNF
 * repetitions (ambiguous ones included, which must not use a closed form); the grammar and json_schema fuzz
 * targets compare a matcher that takes these paths with one that mostly walks (tests/fuzz/lib/constraint_walk.c). */
#include "engine/constraint_pda.h"
#include "engine/json_schema.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

#define CT_ROWS 17                  /* rows of allowed bits for c = 0 .. 16; longer counts from a sorted list */
#define COUNT_INF INT64_MAX         /* an unbounded repetition */
#define SHELF_TABLES 8

typedef struct count_table {
    int words;
    int32_t n_vocab;
    gb_set first_x;                 /* bytes that start an x */
    int32_t maxc;                   /* the largest c of a pure token */
    uint64_t *pure_le;              /* [CT_ROWS][words]: pure tokens with c <= row */
    uint64_t *pure_all;             /* [words] */
    int64_t mlr[CT_ROWS], mlr_all;  /* max (length + rest) over those */
    int32_t n_tail;                 /* pure tokens with c >= CT_ROWS, sorted by c */
    int32_t *tail_id, *tail_c;
    int64_t *tail_mlr;              /* cumulative max of length + rest along the tail */
    int32_t n_brk;                  /* break entries sorted by (byte, j): toks[ka .. kb) broke at j with byte */
    int32_t brk_first[257];
    int32_t *brk_j, *brk_ka, *brk_kb;
    /* x is one byte of a set (a character class of single bytes): the table is made from the vocabulary's byte
     * sets without a walk (c = the length), and the breaks at byte b are found when first needed (matchers'
     * own tables only: the vocabulary's are read-only) */
    int bytes_only;
    gb_set set;
    uint8_t b_done[256];
    int32_t b_n[256];
    int32_t *b_j[256], *b_k[256];   /* sorted by j: toks[k] is x-content for j bytes, then byte b */
    /* per token (walk tables; single-byte ones: c = the length, rest 0): c, and the bytes that finish its last x */
    uint16_t *tok_c;
    uint8_t *tok_rest;
} count_table;

/* The vocabulary's tables, with the grammar they were made on (to compare rules with). Read-only once made. */
struct count_shelf {
    dsv4_grammar *g[2];
    int n;
    int32_t x[SHELF_TABLES];
    int gi[SHELF_TABLES];
    count_table *t[SHELF_TABLES];
};

/* Per matcher: the chains of the grammar and the table of each x (borrowed from the shelf or owned). */
struct count_state {
    int32_t *chain_x;               /* [n_rule]: the x of chain rule O, or -1 */
    int64_t *rleft;                 /* [n_rule]: how many x's chain rule O allows (COUNT_INF: unbounded) */
    count_table **tab;              /* [n_rule] */
    uint8_t *tab_state;             /* [n_rule]: 0 not looked for, 1 borrowed, 2 owned, 3 none, 4 not the
                                     * vocabulary's (built when asked) */
    uint8_t *is_x;                  /* [n_rule]: the x of some counted sequence */
    /* counted sequences: chain rules, and rules of one alternative `x ... x` or `x ... x O` (O a chain of x, or
     * O alone), as gb_repeat makes them: seq_x[W] = x (-1 none), p mandatory x's, R in all, ends in a chain */
    int32_t *seq_x;
    int64_t *seq_p, *seq_r;
    uint8_t *seq_chain;
    int32_t *map;                   /* [n_rule] scratch of rule_same */
};

static void table_free(count_table *t) {
    if (!t) return;
    free(t->pure_le); free(t->pure_all); free(t->tail_id); free(t->tail_c); free(t->tail_mlr);
    free(t->brk_j); free(t->brk_ka); free(t->brk_kb);
    for (int b = 0; b < 256; b++) { free(t->b_j[b]); free(t->b_k[b]); }
    free(t->tok_c); free(t->tok_rest);
    free(t);
}

static size_t table_bytes(const count_table *t) {
    size_t b = sizeof *t + sizeof(uint64_t) * (size_t)t->words * (CT_ROWS + 1) + (size_t)t->n_tail * 16 + (size_t)t->n_brk * 12;
    for (int k = 0; k < 256; k++) b += (size_t)t->b_n[k] * 8;
    if (t->tok_c) b += (size_t)t->n_vocab * 3;
    return b;
}

/* ---- the table of x ------------------------------------------------------------------------------------------ */

typedef struct { int32_t b, j, ka, kb; } brk_entry;

static int brk_cmp(const void *a, const void *b) {
    const brk_entry *x = a, *y = b;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    if (x->j != y->j) return x->j < y->j ? -1 : 1;
    return (x->ka > y->ka) - (x->ka < y->ka);
}


typedef struct { int32_t c, id; int64_t lr; } pure_entry;

static int pure_cmp(const void *a, const void *b) {
    const pure_entry *x = a, *y = b;
    return (x->c > y->c) - (x->c < y->c);
}

/* Growable lists of the walk's findings. */
typedef struct { pure_entry *p; int64_t n, cap; brk_entry *b; int64_t nb, capb; } findings;

static int add_pure(findings *f, int32_t id, int32_t c, int64_t lr) {
    if (f->n == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 4096;
        pure_entry *q = realloc(f->p, sizeof *q * (size_t)f->cap);
        if (!q) return -1;
        f->p = q;
    }
    f->p[f->n++] = (pure_entry){ c, id, lr };
    return 0;
}

static int add_break(findings *f, int b, int32_t j, int32_t ka, int32_t kb) {
    if (ka >= kb) return 0;
    if (f->nb == f->capb) {
        f->capb = f->capb ? 2 * f->capb : 1024;
        brk_entry *q = realloc(f->b, sizeof *q * (size_t)f->capb);
        if (!q) return -1;
        f->b = q;
    }
    f->b[f->nb++] = (brk_entry){ b, j, ka, kb };
    return 0;
}

/* 1 when every alternative of x is one byte set (a character class of single bytes): then each byte is a
 * whole x, and the walk needs no automaton. *set = their union. */
static int single_bytes_into(const dsv4_grammar *g, int32_t x, gb_set *set, int depth) {
    if (depth > 8) return 0;
    for (int32_t a = g->alt_first[x]; a < g->alt_first[x + 1]; a++) {
        const int32_t q = g->alt_pos[a];
        if (g->el[q + 1].kind != GE_END) return 0;
        if (g->el[q].kind == GE_RULE) {   /* an alternative that is one rule of single bytes */
            if (!single_bytes_into(g, g->el[q].arg, set, depth + 1)) return 0;
            continue;
        }
        if (g->el[q].kind != GE_BYTES) return 0;
        for (int w = 0; w < 4; w++) set->w[w] |= g->sets[g->el[q].arg].w[w];
    }
    return 1;
}

static int single_bytes(const dsv4_grammar *g, int32_t x, gb_set *set) {
    memset(set, 0, sizeof *set);
    return single_bytes_into(g, x, set, 0);
}

/* The table of a single-byte x from the vocabulary's byte sets: pure tokens are those whose bytes are all in
 * the set (c = their length, nothing left to finish); breaks come later (byte_breaks). 0, or -1 out of memory. */
static int table_from_bytes(const dsv4_cvocab *v, const gb_set *set, count_table *t) {
    const int words = t->words;
    uint64_t *out = calloc((size_t)words, sizeof *out);
    t->pure_le = malloc(sizeof *t->pure_le * (size_t)words * CT_ROWS);
    t->pure_all = calloc((size_t)words, sizeof *t->pure_all);
    if (!out || !t->pure_le || !t->pure_all) { free(out); return -1; }
    /* pure = tokens with some byte and none outside the set; the bytes >= 0x80 and the control bytes, when the
     * set has none of them (a class of printable ASCII), by one row each */
    int high = 1, ctl = 1;
    for (unsigned b = 0; b < 256; b++)
        if (gb_set_has(set, b)) { if (b >= 0x80) high = 0; if (b < 0x20 || b == 0x7F) ctl = 0; }
    const uint64_t *rows[3] = { high ? v->has_byte + (size_t)256 * words : NULL, ctl ? v->has_byte + (size_t)257 * words : NULL, NULL };
    for (int k = 0; k < 2; k++)
        if (rows[k])
            for (int w = 0; w < words; w++) out[w] |= rows[k][w];
    for (unsigned b = 0; b < 256; b++) {
        if (gb_set_has(set, b) || (high && b >= 0x80) || (ctl && (b < 0x20 || b == 0x7F))) continue;
        const uint64_t *row = v->has_byte + (size_t)b * words;
        for (int w = 0; w < words; w++) out[w] |= row[w];
    }
    const uint64_t *nonempty = v->has_byte + (size_t)258 * words;
    for (int w = 0; w < words; w++) t->pure_all[w] = nonempty[w] & ~out[w];
    t->maxc = 0;
    for (int r = 0; r < CT_ROWS; r++) {
        const uint64_t *le = v->len_le + (size_t)r * words;
        uint64_t *row = t->pure_le + (size_t)r * words, any = 0, over = 0;
        for (int w = 0; w < words; w++) { row[w] = t->pure_all[w] & le[w]; any |= row[w]; over |= t->pure_all[w] & ~le[w]; }
        t->mlr[r] = r;                          /* a bound: the longest such token has at most r bytes */
        if (any && !t->maxc && !over) t->maxc = r;
    }
    /* the tail: pure tokens longer than the rows, by length */
    int32_t n = 0;
    const uint64_t *le = v->len_le + (size_t)(CT_ROWS - 1) * words;
    for (int w = 0; w < words; w++) out[w] = t->pure_all[w] & ~le[w];
    for (int w = 0; w < words; w++) n += __builtin_popcountll(out[w]);
    pure_entry *tl = malloc(sizeof *tl * (size_t)(n + 1));
    t->tail_id = malloc(sizeof *t->tail_id * (size_t)(n + 1));
    t->tail_c = malloc(sizeof *t->tail_c * (size_t)(n + 1));
    t->tail_mlr = malloc(sizeof *t->tail_mlr * (size_t)(n + 1));
    if (!tl || !t->tail_id || !t->tail_c || !t->tail_mlr) { free(out); free(tl); return -1; }
    n = 0;
    for (int w = 0; w < words; w++)
        for (uint64_t bits = out[w]; bits; bits &= bits - 1) {
            const int32_t id = w * 64 + __builtin_ctzll(bits);
            tl[n++] = (pure_entry){ (int32_t)v->len[id], id, (int64_t)v->len[id] };
        }
    qsort(tl, (size_t)n, sizeof *tl, pure_cmp);
    for (int32_t k = 0; k < n; k++) {
        t->tail_c[k] = tl[k].c;
        t->tail_id[k] = tl[k].id;
        t->tail_mlr[k] = tl[k].lr > CT_ROWS - 1 ? tl[k].lr : CT_ROWS - 1;
        if (k && t->tail_mlr[k - 1] > t->tail_mlr[k]) t->tail_mlr[k] = t->tail_mlr[k - 1];
    }
    t->n_tail = n;
    if (n) t->maxc = tl[n - 1].c;
    t->mlr_all = t->maxc;
    free(tl);
    free(out);
    t->bytes_only = 1;
    t->set = *set;
    t->first_x = *set;
    return 0;
}

typedef struct { int32_t j, k; } jk_entry;

static int jk_cmp(const void *a, const void *b) {
    const jk_entry *x = a, *y = b;
    if (x->j != y->j) return x->j < y->j ? -1 : 1;
    return (x->k > y->k) - (x->k < y->k);
}

/* The breaks at byte b of a single-byte table, made when first needed: tokens containing b whose bytes before
 * its first byte outside the set are in it, and that byte is b. 0, or -1 out of memory. */
static int byte_breaks(const dsv4_cvocab *v, count_table *t, unsigned b) {
    if (t->b_done[b]) return 0;
    int32_t n = 0, cap = 0;
    jk_entry *e = NULL;
    if (!gb_set_has(&t->set, b)) {
        const uint64_t *row = v->has_byte + (size_t)b * t->words;
        for (int w = 0; w < t->words; w++)
            for (uint64_t bits = row[w]; bits; bits &= bits - 1) {
                const int32_t id = w * 64 + __builtin_ctzll(bits);
                const unsigned char *p = (const unsigned char *)v->bytes[id];
                uint32_t j = 0;
                while (j < v->len[id] && gb_set_has(&t->set, p[j])) j++;
                if (j == v->len[id] || p[j] != b || v->tok_index[id] < 0) continue;
                if (n == cap) {
                    cap = cap ? 2 * cap : 256;
                    jk_entry *q = realloc(e, sizeof *q * (size_t)cap);
                    if (!q) { free(e); return -1; }
                    e = q;
                }
                e[n++] = (jk_entry){ (int32_t)j, v->tok_index[id] };
            }
    }
    if (n) qsort(e, (size_t)n, sizeof *e, jk_cmp);
    t->b_j[b] = malloc(sizeof *t->b_j[b] * (size_t)(n + 1));
    t->b_k[b] = malloc(sizeof *t->b_k[b] * (size_t)(n + 1));
    if (!t->b_j[b] || !t->b_k[b]) { free(e); return -1; }
    for (int32_t i = 0; i < n; i++) { t->b_j[b][i] = e[i].j; t->b_k[b][i] = e[i].k; }
    free(e);
    t->b_n[b] = n;
    t->b_done[b] = 1;
    return 0;
}

/* The walk of the trie for x's table: pure tokens and breaks into f. 1 done, 0 x is not prefix-free, -1 out of
 * memory. */
static int table_walk(dsv4_cmatcher *m, int32_t S, const gb_set *bytes_only, findings *f, int32_t *xc, int32_t *cn,
                      uint8_t *bd) {
    const dsv4_cvocab *v = m->v;
    const uint16_t *depth = v->depth;
    const uint8_t *byte = v->byte;
    const int32_t *end = v->end, *tok_first = v->tok_first, *toks = v->toks;
    /* at depth d: xc the configuration (S at a boundary), cn the x's started, bd 1 at a boundary (flagged, not
     * told by xc == S: inside an x the configuration may equal S, as in x ::= "a" x | "b") */
    xc[0] = S;
    cn[0] = 0;
    bd[0] = 1;
    for (int32_t i = 1; i < v->n_node;) {
        const int d = depth[i];
        const int32_t pc = xc[d - 1];
        int32_t c;
        if (bytes_only) c = gb_set_has(bytes_only, byte[i]) ? S : -1;
        else {
            const int32_t *tr = m->cfg_trans[pc];
            c = tr ? tr[byte[i]] : T_UNKNOWN;
            if (c == T_UNKNOWN) c = pda_step_byte(m, pc, byte[i]);
            if (c == T_FAIL) return -1;
        }
        if (c < 0) {
            /* at a boundary: a break, for the whole subtree; inside an x: dead */
            if (bd[d - 1] && add_break(f, byte[i], cn[d - 1], tok_first[i], tok_first[end[i]])) return -1;
            i = end[i];
            continue;
        }
        const int32_t started = bd[d - 1] ? cn[d - 1] + 1 : cn[d - 1];
        int at_bound = bytes_only != NULL;
        if (!bytes_only && m->cfg_escape[c]) {
            /* the x is complete; another parse still inside it would make the boundaries ambiguous */
            if (cfg_len(m, c) > 0 || m->cfg_accept[c]) return 0;
            c = S;
            at_bound = 1;
        }
        xc[d] = c;
        cn[d] = started;
        bd[d] = (uint8_t)at_bound;
        const int64_t lr = d + (at_bound ? 0 : m->cfg_min[c]);
        for (int32_t k = tok_first[i]; k < tok_first[i + 1]; k++)
            if (add_pure(f, toks[k], started, lr)) return -1;
        i++;
    }
    return 1;
}

/* The table of rule x, walking the trie on m's automaton. 1 made (*out), 0 x has none (nullable, or not
 * prefix-free), -1 out of memory. */
static int table_build(dsv4_cmatcher *m, int32_t x, int lazy_ok, count_table **out) {
    *out = NULL;
    const dsv4_grammar *g = m->g;
    const dsv4_cvocab *v = m->v;
    if (g->rule_min[x] <= 0) return 0;
    const int32_t na = g->alt_first[x + 1] - g->alt_first[x];
    const int32_t S = pda_enter(m, g->alt_pos + g->alt_first[x], na, PA_WILD);
    if (S == T_FAIL) return -1;
    if (m->cfg_escape[S] || m->cfg_accept[S]) return 0;
    const int words = m->words, D = v->max_depth + 1;
    count_table *t = calloc(1, sizeof *t);
    int32_t *xc = malloc(sizeof *xc * (size_t)D), *cn = malloc(sizeof *cn * (size_t)D);
    uint8_t *bd = malloc((size_t)D);
    findings f = { 0 };
    int rc = -1;
    if (!t || !xc || !cn || !bd) goto done;
    t->words = words;
    t->n_vocab = v->n_vocab;
    gb_set one;
    const int bytes_only = single_bytes(g, x, &one);
    if (bytes_only && lazy_ok) {
        rc = table_from_bytes(v, &one, t) ? -1 : 1;
        goto done;
    }
    if (bytes_only) t->first_x = one;
    else
        for (unsigned b = 0; b < 256; b++) {
            const int32_t c = pda_step_byte(m, S, b);
            if (c == T_FAIL) goto done;
            if (c >= 0) gb_set_add(&t->first_x, b);
        }
    if ((rc = table_walk(m, S, bytes_only ? &one : NULL, &f, xc, cn, bd)) != 1) goto done;
    rc = -1;
    /* pure rows (cumulative) and the tail, sorted by c */
    t->pure_le = calloc((size_t)words * CT_ROWS, sizeof *t->pure_le);
    t->pure_all = calloc((size_t)words, sizeof *t->pure_all);
    t->tok_c = calloc((size_t)v->n_vocab, sizeof *t->tok_c);
    t->tok_rest = calloc((size_t)v->n_vocab, sizeof *t->tok_rest);
    if (!t->pure_le || !t->pure_all || !t->tok_c || !t->tok_rest) goto done;
    int32_t n_tl = 0;
    for (int64_t k = 0; k < f.n; k++) {
        const pure_entry e = f.p[k];
        const int64_t rest = e.lr - (int64_t)v->len[e.id];
        if (e.c > UINT16_MAX || rest > UINT8_MAX) { rc = 0; goto done; }   /* no real x comes close */
        t->tok_c[e.id] = (uint16_t)e.c;
        t->tok_rest[e.id] = (uint8_t)rest;
        t->pure_all[e.id >> 6] |= 1ULL << (e.id & 63);
        if (e.lr > t->mlr_all) t->mlr_all = e.lr;
        if (e.c > t->maxc) t->maxc = e.c;
        if (e.c < CT_ROWS) {
            t->pure_le[(size_t)e.c * words + (e.id >> 6)] |= 1ULL << (e.id & 63);
            if (e.lr > t->mlr[e.c]) t->mlr[e.c] = e.lr;
        } else f.p[n_tl++] = e;   /* in place: n_tl <= k */
    }
    for (int r = 1; r < CT_ROWS; r++) {
        for (int w = 0; w < words; w++) t->pure_le[(size_t)r * words + w] |= t->pure_le[(size_t)(r - 1) * words + w];
        if (t->mlr[r - 1] > t->mlr[r]) t->mlr[r] = t->mlr[r - 1];
    }
    if (n_tl) qsort(f.p, (size_t)n_tl, sizeof *f.p, pure_cmp);
    t->n_tail = n_tl;
    t->tail_id = malloc(sizeof *t->tail_id * (size_t)(n_tl + 1));
    t->tail_c = malloc(sizeof *t->tail_c * (size_t)(n_tl + 1));
    t->tail_mlr = malloc(sizeof *t->tail_mlr * (size_t)(n_tl + 1));
    if (!t->tail_id || !t->tail_c || !t->tail_mlr) goto done;
    int64_t mx = t->mlr[CT_ROWS - 1];
    for (int32_t k = 0; k < n_tl; k++) {
        t->tail_c[k] = f.p[k].c;
        t->tail_id[k] = f.p[k].id;
        if (f.p[k].lr > mx) mx = f.p[k].lr;
        t->tail_mlr[k] = mx;
    }
    /* break entries by (byte, j) */
    if (f.nb) qsort(f.b, (size_t)f.nb, sizeof *f.b, brk_cmp);
    t->n_brk = (int32_t)f.nb;
    t->brk_j = malloc(sizeof *t->brk_j * (size_t)(f.nb + 1));
    t->brk_ka = malloc(sizeof *t->brk_ka * (size_t)(f.nb + 1));
    t->brk_kb = malloc(sizeof *t->brk_kb * (size_t)(f.nb + 1));
    if (!t->brk_j || !t->brk_ka || !t->brk_kb) goto done;
    int32_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < f.nb && f.b[k].b < b) k++;
        t->brk_first[b] = k;
    }
    for (int64_t e = 0; e < f.nb; e++) { t->brk_j[e] = f.b[e].j; t->brk_ka[e] = f.b[e].ka; t->brk_kb[e] = f.b[e].kb; }
    rc = 1;
done:
    free(xc); free(cn); free(bd); free(f.p); free(f.b);
    if (rc == 1) *out = t;
    else table_free(t);
    return rc;
}

/* ---- rules compared across grammars ----------------------------------------------------------------------- */

/* 1 when rule x of a and rule y of b match the same bytes because they are the same rules, element for element
 * (rules reached from them too; map[] of a's rules, -1 = not yet paired, is the pairing assumed so far). */
static int rule_same(const dsv4_grammar *a, int32_t x, const dsv4_grammar *b, int32_t y, int32_t *map, int depth) {
    if (map[x] >= 0) return map[x] == y;
    if (depth > 64) return 0;
    const int32_t n = a->alt_first[x + 1] - a->alt_first[x];
    if (n != b->alt_first[y + 1] - b->alt_first[y]) return 0;
    map[x] = y;
    for (int32_t i = 0; i < n; i++) {
        int32_t p = a->alt_pos[a->alt_first[x] + i], q = b->alt_pos[b->alt_first[y] + i];
        for (;; p++, q++) {
            const gelem e = a->el[p], f = b->el[q];
            if (e.kind != f.kind) return 0;
            if (e.kind == GE_END) break;
            if (e.kind == GE_BYTES && memcmp(&a->sets[e.arg], &b->sets[f.arg], sizeof(gb_set))) return 0;
            if (e.kind == GE_TOKEN && strcmp(a->special[e.arg], b->special[f.arg])) return 0;
            if (e.kind == GE_RULE && !rule_same(a, e.arg, b, f.arg, map, depth + 1)) return 0;
        }
    }
    return 1;
}

/* ---- chains --------------------------------------------------------------------------------------------- */

/* Chain rule O: two alternatives, one empty and one `x O'` or `x` (x not nullable). Its x and next rule
 * (-1 none), or 0 when O is not one. */
static int chain_step(const dsv4_grammar *g, int32_t o, int32_t *x, int32_t *next) {
    if (g->alt_first[o + 1] - g->alt_first[o] != 2) return 0;
    int32_t a = g->alt_pos[g->alt_first[o]], e = g->alt_pos[g->alt_first[o] + 1];
    if (g->el[a].kind == GE_END) { const int32_t t = a; a = e; e = t; }
    if (g->el[e].kind != GE_END || g->el[a].kind != GE_RULE || g->rule_min[g->el[a].arg] <= 0) return 0;
    *x = g->el[a].arg;
    if (g->el[a + 1].kind == GE_END) { *next = -1; return 1; }
    if (g->el[a + 1].kind != GE_RULE || g->el[a + 2].kind != GE_END) return 0;
    *next = g->el[a + 1].arg;
    return 1;
}

static int state_init(dsv4_cmatcher *m) {
    const dsv4_grammar *g = m->g;
    count_state *C = calloc(1, sizeof *C);
    if (!C) return -1;
    m->cnt = C;
    const size_t n = (size_t)g->n_rule;
    C->chain_x = malloc(sizeof *C->chain_x * n);
    C->rleft = malloc(sizeof *C->rleft * n);
    C->tab = calloc(n, sizeof *C->tab);
    C->tab_state = calloc(n, 1);
    C->map = malloc(sizeof *C->map * n);
    C->is_x = calloc(n, 1);
    C->seq_x = malloc(sizeof *C->seq_x * n);
    C->seq_p = malloc(sizeof *C->seq_p * n);
    C->seq_r = malloc(sizeof *C->seq_r * n);
    C->seq_chain = calloc(n, 1);
    int32_t *path = malloc(sizeof *path * n);
    uint8_t *mark = calloc(n, 1);   /* 1 on the current path, 2 resolved */
    if (!C->chain_x || !C->rleft || !C->tab || !C->tab_state || !C->map || !C->is_x || !C->seq_x || !C->seq_p || !C->seq_r || !C->seq_chain || !path || !mark) { free(path); free(mark); return -1; }
    for (int32_t r = 0; r < g->n_rule; r++) C->chain_x[r] = -1;
    /* follow each chain to its end (-1), a resolved rule, a rule that is not a chain of the same x, or itself
     * again (unbounded), then resolve the path backwards */
    for (int32_t r0 = 0; r0 < g->n_rule; r0++) {
        if (mark[r0]) continue;
        int32_t np = 0, r = r0, x0 = -1, x, next;
        int64_t tail = 0;        /* x's allowed after the path's last rule; -1: the path is not a chain */
        for (;;) {
            if (!chain_step(g, r, &x, &next) || (x0 >= 0 && x != x0)) { tail = -1; break; }
            x0 = x;
            mark[r] = 1;
            path[np++] = r;
            if (next < 0) { tail = 0; break; }
            if (mark[next] == 1) { tail = COUNT_INF; break; }
            if (mark[next] == 2) {
                tail = C->chain_x[next] == x0 ? C->rleft[next] : -1;
                break;
            }
            r = next;
        }
        for (int32_t k = np - 1; k >= 0; k--) {
            mark[path[k]] = 2;
            if (tail < 0) continue;
            tail = tail == COUNT_INF ? COUNT_INF : tail + 1;
            C->chain_x[path[k]] = x0;
            C->rleft[path[k]] = tail;
            C->is_x[x0] = 1;
        }
        if (!mark[r0]) mark[r0] = 2;
    }
    free(path);
    free(mark);
    /* counted sequences */
    for (int32_t w = 0; w < g->n_rule; w++) {
        C->seq_x[w] = -1;
        if (C->chain_x[w] >= 0) {
            C->seq_x[w] = C->chain_x[w];
            C->seq_p[w] = 0;
            C->seq_r[w] = C->rleft[w];
            C->seq_chain[w] = 1;
            continue;
        }
        if (g->alt_first[w + 1] - g->alt_first[w] != 1) continue;
        int32_t q = g->alt_pos[g->alt_first[w]], x = -1;
        int64_t p = 0, r = 0;
        int chain = 0;
        for (; g->el[q].kind == GE_RULE; q++) {
            const int32_t a = g->el[q].arg;
            if (x < 0 && g->rule_min[a] > 0) x = a;
            if (a == x) { p++; r++; continue; }
            if (C->chain_x[a] >= 0 && (x < 0 || C->chain_x[a] == x)) {
                x = C->chain_x[a];
                r = C->rleft[a] == COUNT_INF ? COUNT_INF : r + C->rleft[a];
                chain = 1;
                q++;
            }
            break;
        }
        if (x < 0 || g->el[q].kind != GE_END) continue;
        C->seq_x[w] = x;
        C->seq_p[w] = p;
        C->seq_r[w] = r;
        C->seq_chain[w] = (uint8_t)chain;
        C->is_x[x] = 1;
    }
    return 0;
}

void count_free(dsv4_cmatcher *m) {
    count_state *C = m->cnt;
    if (!C) return;
    for (int32_t r = 0; r < m->g->n_rule && C->tab_state; r++)
        if (C->tab_state[r] == 2) table_free(C->tab[r]);
    free(C->chain_x); free(C->rleft); free(C->tab); free(C->tab_state); free(C->map); free(C->is_x);
    free(C->seq_x); free(C->seq_p); free(C->seq_r); free(C->seq_chain);
    free(C);
    m->cnt = NULL;
}

size_t count_bytes(const dsv4_cmatcher *m) {
    const count_state *C = m->cnt;
    if (!C) return 0;
    size_t b = sizeof *C + (size_t)m->g->n_rule * (sizeof(int32_t) * 2 + sizeof(int64_t) + sizeof(void *) + 1);
    for (int32_t r = 0; r < m->g->n_rule; r++)
        if (C->tab_state[r] == 2) b += table_bytes(C->tab[r]);
    return b;
}

/* The table of x: the vocabulary's for the same rule, else (with build) built now; NULL when none. -1 out of
 * memory. */
static int table_for(dsv4_cmatcher *m, int32_t x, int build, const count_table **out) {
    count_state *C = m->cnt;
    *out = NULL;
    if (C->tab_state[x] == 1 || C->tab_state[x] == 2) { *out = C->tab[x]; return 0; }
    if (C->tab_state[x] == 3 || !C->is_x[x]) return 0;
    const struct count_shelf *sh = m->v->count_shelf;
    for (int i = 0; sh && C->tab_state[x] == 0 && i < sh->n; i++) {
        const dsv4_grammar *sg = sh->g[sh->gi[i]];
        for (int32_t r = 0; r < m->g->n_rule; r++) C->map[r] = -1;
        if (rule_same(m->g, x, sg, sh->x[i], C->map, 0)) {
            C->tab[x] = sh->t[i];
            C->tab_state[x] = 1;
            *out = C->tab[x];
            return 0;
        }
    }
    C->tab_state[x] = 4;
    if (!build) return 0;
    count_table *t;
    const int rc = table_build(m, x, 1, &t);
    if (rc < 0) return -1;
    C->tab[x] = t;
    C->tab_state[x] = rc ? 2 : 3;
    *out = t;
    return 0;
}

/* ---- the closed form ------------------------------------------------------------------------------------- */

/* The bytes the ready nodes of configuration c read (those not in `skip`, a sorted list, when given). */
static void first_bytes(const dsv4_cmatcher *m, int32_t c, const int32_t *skip, int32_t n_skip, gb_set *out) {
    memset(out, 0, sizeof *out);
    const int32_t *it = cfg_items(m, c);
    for (int32_t i = 0, s = 0; i < cfg_len(m, c); i++) {
        while (s < n_skip && skip[s] < it[i]) s++;
        if (s < n_skip && skip[s] == it[i]) continue;
        const gelem e = m->g->el[m->node[it[i]].pos];
        if (e.kind != GE_BYTES) continue;
        for (int w = 0; w < 4; w++) out->w[w] |= m->g->sets[e.arg].w[w];
    }
}

static int sets_meet(const gb_set *a, const gb_set *b) {
    for (int w = 0; w < 4; w++)
        if (a->w[w] & b->w[w]) return 1;
    return 0;
}

/* Uncertain: the break entries of t with byte in `bytes` and j0 <= j <= j1. */
static int add_breaks(dsv4_cmatcher *m, int slot, const count_table *t, const gb_set *bytes, int64_t j0, int64_t j1) {
    for (unsigned b = 0; b < 256; b++) {
        if (!gb_set_has(bytes, b)) continue;
        if (t->bytes_only) {
            /* the matcher's own table (the vocabulary's are never bytes_only): mutable, like the matcher */
            if (byte_breaks(m->v, (count_table *)t, b)) return -1;
            for (int32_t e = 0; e < t->b_n[b] && t->b_j[b][e] <= j1; e++)
                if (t->b_j[b][e] >= j0 && ci_add_range(m, slot, t->b_k[b][e], t->b_k[b][e] + 1)) return -1;
            continue;
        }
        int32_t lo = t->brk_first[b], hi = t->brk_first[b + 1];
        while (lo < hi) {   /* the first entry with j >= j0 */
            const int32_t mid = lo + (hi - lo) / 2;
            if (t->brk_j[mid] < j0) lo = mid + 1; else hi = mid;
        }
        for (int32_t e = lo; e < t->brk_first[b + 1] && t->brk_j[e] <= j1; e++)
            if (ci_add_range(m, slot, t->brk_ka[e], t->brk_kb[e])) return -1;
    }
    return 0;
}

int count_fill(dsv4_cmatcher *m, int32_t tc, int slot, int build) {
    if (m->cfg_escape[tc]) return 0;
    if (!m->cnt && state_init(m)) return -1;
    const dsv4_grammar *g = m->g;
    const count_state *C = m->cnt;
    /* a frame F pushed by a reference to x (the x of some chain), below one of tc's ready nodes */
    int32_t F = -1, x = -1;
    for (int32_t i = 0; i < cfg_len(m, tc) && F < 0; i++) {
        const int32_t par = m->node[cfg_items(m, tc)[i]].parent;
        if (par < 0) continue;
        const int32_t q = m->node[par].pos;
        if (q == 0 || g->el[q - 1].kind != GE_RULE || !C->is_x[g->el[q - 1].arg]) continue;
        F = par;
        x = g->el[q - 1].arg;
    }
    if (F < 0) return 0;
    const count_table *t;
    if (table_for(m, x, build, &t)) return -1;
    if (!t) return 0;
    /* the count shape after this x: p mandatory x's, R in all, then K = (qk, P) */
    const int32_t P = m->node[F].parent;
    int32_t qk = m->node[F].pos;
    int64_t p = 0, R = 0;
    for (;;) {
        const gelem e = g->el[qk];
        if (e.kind == GE_RULE && e.arg == x) { p++; R++; qk++; continue; }
        if (e.kind == GE_RULE && C->seq_x[e.arg] == x) {
            const int32_t w = e.arg;
            p += C->seq_p[w];
            R = C->seq_r[w] == COUNT_INF || R == COUNT_INF ? COUNT_INF : R + C->seq_r[w];
            qk++;
            if (!C->seq_chain[w]) continue;   /* after optional x's, more x's would not fit the shape */
        }
        break;
    }
    /* tc = Xs(F) + E0, checked by id */
    const int32_t na = g->alt_first[x + 1] - g->alt_first[x];
    const int32_t Xs = pda_enter(m, g->alt_pos + g->alt_first[x], na, F);
    if (Xs == T_FAIL) return -1;
    if (m->cfg_escape[Xs] || m->cfg_accept[Xs]) return 0;
    const int32_t *xi = cfg_items(m, Xs), *ti = cfg_items(m, tc);
    const int32_t nx = cfg_len(m, Xs), nt = cfg_len(m, tc);
    for (int32_t i = 0, j = 0; i < nx; i++) {
        while (j < nt && ti[j] < xi[i]) j++;
        if (j == nt || ti[j] != xi[i]) return 0;
    }
    gb_set first_e0, first_k;
    first_bytes(m, tc, cfg_items(m, Xs), nx, &first_e0);
    if (sets_meet(&first_e0, &t->first_x)) return 0;
    const int32_t K = pda_enter(m, &qk, 1, P);
    if (K == T_FAIL) return -1;
    if (m->cfg_escape[K]) return 0;
    first_bytes(m, K, NULL, 0, &first_k);
    if (sets_meet(&first_k, &t->first_x)) return 0;
    /* allowed: pure tokens with c <= R + 1 */
    const int64_t Rt = R == COUNT_INF ? COUNT_INF : R + 1;
    uint64_t *bits = m->ci_bits + (size_t)slot * m->words;
    int64_t mlr;
    if (Rt >= t->maxc) {
        memcpy(bits, t->pure_all, sizeof *bits * (size_t)m->words);
        mlr = t->mlr_all;
    } else if (Rt < CT_ROWS) {
        memcpy(bits, t->pure_le + (size_t)Rt * m->words, sizeof *bits * (size_t)m->words);
        mlr = t->mlr[Rt];
    } else {
        memcpy(bits, t->pure_le + (size_t)(CT_ROWS - 1) * m->words, sizeof *bits * (size_t)m->words);
        mlr = t->mlr[CT_ROWS - 1];
        for (int32_t k = 0; k < t->n_tail && t->tail_c[k] <= Rt; k++) {
            bits[t->tail_id[k] >> 6] |= 1ULL << (t->tail_id[k] & 63);
            mlr = t->tail_mlr[k];
        }
    }
    m->ci_n_ranges[slot] = 0;
    m->ci_uncertain[slot] = 0;
    if (add_breaks(m, slot, t, &first_e0, 0, 0) || add_breaks(m, slot, t, &first_k, p + 1, Rt)) return -1;
    m->ci_need[slot] = mlr + (p + 1) * g->rule_min[x] + m->cfg_min[K];
    m->ci_ct[slot] = t;
    m->ci_ct_p[slot] = p;
    m->ci_ct_xmin[slot] = g->rule_min[x];
    m->ci_ct_kmin[slot] = m->cfg_min[K];
    m->st.count_forms++;
    return 1;
}

void count_budget(const dsv4_cmatcher *m, int slot, int64_t left, uint64_t *bits, int64_t *need, int *cut) {
    const count_table *t = m->ci_ct[slot];
    const uint64_t *src = m->ci_bits + (size_t)slot * m->words;
    const int64_t p = m->ci_ct_p[slot], xmin = m->ci_ct_xmin[slot], kmin = m->ci_ct_kmin[slot];
    const uint32_t *len = m->v->len;
    int64_t nd_max = 0;
    for (int w = 0; w < m->words; w++) {
        uint64_t keep = 0;
        for (uint64_t b = src[w]; b; b &= b - 1) {
            const int32_t id = w * 64 + __builtin_ctzll(b);
            /* c x's started, the last one `rest` bytes from complete; p + 1 - c mandatory ones still to come */
            const int64_t c = t->tok_c ? t->tok_c[id] : (int64_t)len[id], rest = t->tok_rest ? t->tok_rest[id] : 0;
            const int64_t nd = (int64_t)len[id] + rest + (c < p + 1 ? (p + 1 - c) * xmin : 0) + kmin;
            if (nd > left) { *cut = 1; continue; }
            keep |= b & -b;
            if (nd > nd_max) nd_max = nd;
        }
        bits[w] = keep;
    }
    *need = nd_max;
}

/* ---- the vocabulary's tables ----------------------------------------------------------------------------- */

void count_shelf_free(struct count_shelf *sh) {
    if (!sh) return;
    for (int i = 0; i < sh->n; i++) table_free(sh->t[i]);
    for (int i = 0; i < 2; i++) dsv4_grammar_free(sh->g[i]);
    free(sh);
}

/* Tables for the x of every chain of a schema grammar with string values and extra keys (JSON's string and key
 * characters, whitespace), plain and with '<' escaped as tool calls write it. */
int count_prepare_json(dsv4_cvocab *v, dsv4_error *err) {
    static const char schema[] = "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}";
    if (v->count_shelf) return 0;
    struct count_shelf *sh = calloc(1, sizeof *sh);
    if (!sh) return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory");
    v->count_shelf = sh;
    int rc = 0;
    for (int lt = 0; lt < 2 && !rc; lt++) {
        const dsv4_schema_opts o = { 0, lt };
        dsv4_cmatcher *m = NULL;
        if ((rc = dsv4_grammar_from_schema_text(schema, sizeof schema - 1, &o, &sh->g[lt], err))) break;
        if ((rc = dsv4_cmatcher_new(sh->g[lt], v, &m, err))) break;
        if (state_init(m)) rc = dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory");
        for (int32_t r = 0; !rc && r < sh->g[lt]->n_rule; r++) {
            const int32_t x = m->cnt->chain_x[r];
            if (x < 0 || m->cnt->tab_state[x] || sh->n == SHELF_TABLES) continue;
            int have = 0;   /* the same rule in the other grammar (whitespace) */
            for (int i = 0; i < sh->n && !have; i++) {
                for (int32_t k = 0; k < sh->g[lt]->n_rule; k++) m->cnt->map[k] = -1;
                have = rule_same(sh->g[lt], x, sh->g[sh->gi[i]], sh->x[i], m->cnt->map, 0);
            }
            if (have) continue;
            count_table *t;
            const int b = table_build(m, x, 0, &t);
            if (b < 0) { rc = dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory (the vocabulary's count tables)"); break; }
            m->cnt->tab_state[x] = 3;
            if (b) { sh->x[sh->n] = x; sh->gi[sh->n] = lt; sh->t[sh->n] = t; sh->n++; }
        }
        dsv4_cmatcher_free(m);
    }
    return rc;
}
