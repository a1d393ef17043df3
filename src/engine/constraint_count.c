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
 * The table of x (constraint_count_table.h), made once per x and vocabulary: every token is pure (all x
 * content; c = the x's it starts, `rest` = the bytes that complete the last one), a break (after j complete x's
 * a byte b that cannot start an x) or dead (it stops inside an x). The vocabulary keeps the tables of JSON's
 * string and key characters (dsv4_cvocab_prepare_json, ~25 ms at load); a matcher finds them by comparing
 * rules structurally (the same rules match the same bytes), and makes its own for other x's, once per x (when
 * the probe of constraint_sig.c finds the configuration wide).
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
 * One byte before such a start (count_fill_after_byte): when every byte a configuration reads leads to the
 * same start and is itself an x of one byte (a GBNF literal's last space before [a-zA-Z ,']{1,300}), a token
 * b u reads from it as u from the start, with one x more: the same form with p + 1 and R + 1, on the tokens
 * whose first byte is one of those.
 *
 * Not handled (a walk as before): the last x of a chain (`x` alone, no frame: one character left), positions
 * inside an x, an x followed by bytes of x (the checks above), and a literal byte before a repetition that is
 * not an x itself (the quote before a JSON string's characters).
 *
 * Exactness: tests/unit/test_constraint_count.c checks every mask against each token's own answer on counted
 * strings at every count, escapes, UTF-8 pieces, closing quotes followed by other bytes, extra keys and GBNF
 * repetitions (ambiguous ones included, which must not use a closed form); the grammar and json_schema fuzz
 * targets compare a matcher that takes these paths with one that mostly walks (tests/fuzz/lib/constraint_walk.c). */
#include "engine/constraint_count_table.h"
#include "engine/json_schema.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

#define COUNT_INF INT64_MAX         /* an unbounded repetition */
#define SHELF_TABLES 8

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
        if (C->tab_state[r] == 2) count_table_free(C->tab[r]);
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
        if (C->tab_state[r] == 2) b += count_table_bytes(C->tab[r]);
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
    const int rc = count_table_build(m, x, 1, &t);
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

/* Uncertain: the break entries of t with byte in `bytes` and j0 <= j <= j1 (of tokens whose first byte is in
 * `first`, when given: single-byte tables only). */
static int add_breaks(dsv4_cmatcher *m, int slot, const count_table *t, const gb_set *bytes, int64_t j0, int64_t j1,
                      const gb_set *first) {
    for (unsigned b = 0; b < 256; b++) {
        if (!gb_set_has(bytes, b)) continue;
        if (t->bytes_only) {
            /* the matcher's own table (the vocabulary's are never bytes_only): mutable, like the matcher */
            if (count_table_breaks(m->v, (count_table *)t, b)) return -1;
            for (int32_t e = 0; e < t->b_n[b] && t->b_j[b][e] <= j1; e++) {
                const int32_t k = t->b_k[b][e];
                if (t->b_j[b][e] < j0 || (first && !gb_set_has(first, (unsigned char)m->v->bytes[m->v->toks[k]][0]))) continue;
                if (ci_add_range(m, slot, k, k + 1)) return -1;
            }
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

/* A configuration recognised as the start of an x of a counted repetition (the closed form above). */
typedef struct {
    const count_table *t;
    int64_t p, Rt;                  /* mandatory x's after this one; x's allowed in all, this one included */
    gb_set first_e0, first_k;
    int64_t xmin, kmin;             /* the shortest x; K's shortest completion */
} count_shape;

/* tc's shape: 1 found, 0 not that form, -1 out of memory. */
static int shape_of(dsv4_cmatcher *m, int32_t tc, int build, count_shape *sh) {
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
    first_bytes(m, tc, cfg_items(m, Xs), nx, &sh->first_e0);
    if (sets_meet(&sh->first_e0, &t->first_x)) return 0;
    const int32_t K = pda_enter(m, &qk, 1, P);
    if (K == T_FAIL) return -1;
    if (m->cfg_escape[K]) return 0;
    first_bytes(m, K, NULL, 0, &sh->first_k);
    if (sets_meet(&sh->first_k, &t->first_x)) return 0;
    sh->t = t;
    sh->p = p;
    sh->Rt = R == COUNT_INF ? COUNT_INF : R + 1;
    sh->xmin = g->rule_min[x];
    sh->kmin = m->cfg_min[K];
    return 1;
}

/* Pure tokens with c <= Rt into bits; returns the largest length + rest among them. */
static int64_t pure_upto(const count_table *t, int64_t Rt, uint64_t *bits) {
    const int words = t->words;
    if (Rt >= t->maxc) {
        memcpy(bits, t->pure_all, sizeof *bits * (size_t)words);
        return t->mlr_all;
    }
    if (Rt < CT_ROWS) {
        memcpy(bits, t->pure_le + (size_t)Rt * words, sizeof *bits * (size_t)words);
        return t->mlr[Rt];
    }
    memcpy(bits, t->pure_le + (size_t)(CT_ROWS - 1) * words, sizeof *bits * (size_t)words);
    int64_t mlr = t->mlr[CT_ROWS - 1];
    for (int32_t k = 0; k < t->n_tail && t->tail_c[k] <= Rt; k++) {
        bits[t->tail_id[k] >> 6] |= 1ULL << (t->tail_id[k] & 63);
        mlr = t->tail_mlr[k];
    }
    return mlr;
}

static void set_slot_shape(dsv4_cmatcher *m, int slot, const count_shape *sh, int64_t p, int64_t mlr) {
    m->ci_need[slot] = mlr + (p + 1) * sh->xmin + sh->kmin;
    m->ci_ct[slot] = sh->t;
    m->ci_ct_p[slot] = p;
    m->ci_ct_xmin[slot] = sh->xmin;
    m->ci_ct_kmin[slot] = sh->kmin;
    m->st.count_forms++;
}

int count_fill(dsv4_cmatcher *m, int32_t tc, int slot, int build) {
    count_shape sh;
    const int rc = shape_of(m, tc, build, &sh);
    if (rc <= 0) return rc;
    /* allowed: pure tokens with c <= R + 1; uncertain: the breaks into E0 or K */
    const int64_t mlr = pure_upto(sh.t, sh.Rt, m->ci_bits + (size_t)slot * m->words);
    m->ci_n_ranges[slot] = 0;
    m->ci_uncertain[slot] = 0;
    if (add_breaks(m, slot, sh.t, &sh.first_e0, 0, 0, NULL) || add_breaks(m, slot, sh.t, &sh.first_k, sh.p + 1, sh.Rt, NULL)) return -1;
    set_slot_shape(m, slot, &sh, sh.p, mlr);
    return 1;
}

int count_fill_after_byte(dsv4_cmatcher *m, int32_t c, int slot) {
    if (m->cfg_escape[c] || cfg_len(m, c) == 0) return 0;
    /* every byte c reads leads to one configuration c1 */
    gb_set b0;
    first_bytes(m, c, NULL, 0, &b0);
    int32_t c1 = -1;
    for (unsigned b = 0; b < 256; b++) {
        if (!gb_set_has(&b0, b)) continue;
        const int32_t n = pda_step_byte(m, c, b);
        if (n == T_FAIL) return -1;
        if (n < 0 || (c1 >= 0 && n != c1)) return 0;
        c1 = n;
    }
    if (c1 < 0) return 0;
    count_shape sh;
    const int rc = shape_of(m, c1, 1, &sh);
    if (rc <= 0) return rc;
    /* those bytes are x's of one byte: a token b u reads as x's from c as u does from c1, one x more */
    if (!sh.t->bytes_only) return 0;
    for (int w = 0; w < 4; w++)
        if (b0.w[w] & ~sh.t->set.w[w]) return 0;
    const dsv4_cvocab *v = m->v;
    uint64_t *bits = m->ci_bits + (size_t)slot * m->words;
    const int64_t Rt = sh.Rt == COUNT_INF ? COUNT_INF : sh.Rt + 1;
    const int64_t mlr = pure_upto(sh.t, Rt, m->bits);
    memset(bits, 0, sizeof *bits * (size_t)m->words);
    for (int32_t i = 1; i < v->n_node; i = v->end[i])   /* the depth-1 nodes: tokens by first byte */
        if (gb_set_has(&b0, v->byte[i]))
            for (int32_t k = v->tok_first[i]; k < v->tok_first[v->end[i]]; k++) {
                const int32_t id = v->toks[k];
                bits[id >> 6] |= m->bits[id >> 6] & (1ULL << (id & 63));
            }
    m->ci_n_ranges[slot] = 0;
    m->ci_uncertain[slot] = 0;
    if (add_breaks(m, slot, sh.t, &sh.first_e0, 1, 1, &b0) || add_breaks(m, slot, sh.t, &sh.first_k, sh.p + 2, Rt, &b0))
        return -1;
    set_slot_shape(m, slot, &sh, sh.p + 1, mlr);
    return 1;
}

int count_budget(dsv4_cmatcher *m, int slot, int64_t left, uint64_t *bits, int64_t *need, int *cut) {
    const count_table *t = m->ci_ct[slot];
    const uint64_t *src = m->ci_bits + (size_t)slot * m->words;
    const int64_t p = m->ci_ct_p[slot], xmin = m->ci_ct_xmin[slot], kmin = m->ci_ct_kmin[slot];
    /* the matcher's own single-byte tables get their order here (the vocabulary's have it) */
    if (count_table_by_length(m->v, (count_table *)t)) return -1;
    memcpy(bits, src, sizeof *bits * (size_t)m->words);
    /* only tokens whose length + rest + the most the rest of the form may add exceeds the budget are looked at:
     * the longest ones, first in by_lr */
    const int64_t most = (p + 1) * xmin + kmin;
    const uint32_t *len = m->v->len;
    for (int32_t k = 0; k < t->n_by_lr && t->by_lr[k] + most > left; k++) {
        const int32_t id = t->by_lr_id[k];
        if (!((src[id >> 6] >> (id & 63)) & 1)) continue;
        /* c x's started, the last one `rest` bytes from complete; p + 1 - c mandatory ones still to come */
        const int64_t c = t->tok_c ? t->tok_c[id] : (int64_t)len[id];
        const int64_t nd = t->by_lr[k] + (c < p + 1 ? (p + 1 - c) * xmin : 0) + kmin;
        if (nd > left) { bits[id >> 6] &= ~(1ULL << (id & 63)); *cut = 1; }
    }
    *need = left;   /* nothing cut: the same tokens for any budget from `left` up */
    return 0;
}

/* ---- the vocabulary's tables ----------------------------------------------------------------------------- */

void count_shelf_free(struct count_shelf *sh) {
    if (!sh) return;
    for (int i = 0; i < sh->n; i++) count_table_free(sh->t[i]);
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
            const int b = count_table_build(m, x, 0, &t);
            if (b < 0) { rc = dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory (the vocabulary's count tables)"); break; }
            m->cnt->tab_state[x] = 3;
            if (b) { sh->x[sh->n] = x; sh->gi[sh->n] = lt; sh->t[sh->n] = t; sh->n++; }
        }
        dsv4_cmatcher_free(m);
    }
    return rc;
}
