/* Tables of the x's of counted repetitions: see constraint_count_table.h. */
#include "engine/constraint_count_table.h"
#include <stdlib.h>
#include <string.h>

void count_table_free(count_table *t) {
    if (!t) return;
    free(t->pure_le); free(t->pure_all); free(t->tail_id); free(t->tail_c); free(t->tail_mlr);
    free(t->brk_j); free(t->brk_ka); free(t->brk_kb);
    for (int b = 0; b < 256; b++) { free(t->b_j[b]); free(t->b_k[b]); }
    free(t->tok_c); free(t->tok_rest); free(t->by_lr_id); free(t->by_lr);
    free(t);
}

size_t count_table_bytes(const count_table *t) {
    size_t b = sizeof *t + sizeof(uint64_t) * (size_t)t->words * (CT_ROWS + 1) + (size_t)t->n_tail * 16 + (size_t)t->n_brk * 12;
    for (int k = 0; k < 256; k++) b += (size_t)t->b_n[k] * 8;
    if (t->tok_c) b += (size_t)t->n_vocab * 3;
    b += (size_t)t->n_by_lr * 8;
    return b;
}

int count_table_by_length(const dsv4_cvocab *v, count_table *t) {
    if (t->by_lr_id) return 0;
    /* a counting sort on length + rest (at most MAX_TOKEN_BYTES + 255) */
    int32_t top = 0, n = 0;
    for (int w = 0; w < t->words; w++)
        for (uint64_t bits = t->pure_all[w]; bits; bits &= bits - 1) {
            const int32_t id = w * 64 + __builtin_ctzll(bits);
            const int32_t lr = (int32_t)v->len[id] + (t->tok_rest ? t->tok_rest[id] : 0);
            if (lr > top) top = lr;
            n++;
        }
    int32_t *at = calloc((size_t)top + 2, sizeof *at);
    t->by_lr_id = malloc(sizeof *t->by_lr_id * (size_t)(n + 1));
    t->by_lr = malloc(sizeof *t->by_lr * (size_t)(n + 1));
    if (!at || !t->by_lr_id || !t->by_lr) {
        free(at); free(t->by_lr_id); free(t->by_lr);
        t->by_lr_id = t->by_lr = NULL;
        return -1;
    }
    /* at[i]: how many have length + rest top - i (longest first), then where they start */
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            for (int32_t i = 0, sum = 0; i <= top; i++) { const int32_t c = at[i]; at[i] = sum; sum += c; }
        for (int w = 0; w < t->words; w++)
            for (uint64_t bits = t->pure_all[w]; bits; bits &= bits - 1) {
                const int32_t id = w * 64 + __builtin_ctzll(bits);
                const int32_t lr = (int32_t)v->len[id] + (t->tok_rest ? t->tok_rest[id] : 0);
                if (!pass) { at[top - lr]++; continue; }
                const int32_t k = at[top - lr]++;
                t->by_lr_id[k] = id;
                t->by_lr[k] = lr;
            }
    }
    free(at);
    t->n_by_lr = n;
    return 0;
}

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
 * the set (c = their length, nothing left to finish); breaks come later (count_table_breaks). 0, or -1 out of memory. */
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
int count_table_breaks(const dsv4_cvocab *v, count_table *t, unsigned b) {
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
int count_table_build(dsv4_cmatcher *m, int32_t x, int lazy_ok, count_table **out) {
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
    if (count_table_by_length(v, t)) goto done;
    rc = 1;
done:
    free(xc); free(cn); free(bd); free(f.p); free(f.b);
    if (rc == 1) *out = t;
    else count_table_free(t);
    return rc;
}
