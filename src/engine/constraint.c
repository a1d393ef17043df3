/* The constraint matcher: a pushdown automaton over bytes run on a grammar (grammar_ir.h), and the token mask.
 *
 * Parse stacks. A stack is a list of grammar positions: the top is the next element to match, each frame
 * below is where to continue in the calling rule. Stacks are interned as nodes (position, parent node), so a
 * stack is one integer and equal stacks are the same integer. A reference in tail position pushes no frame
 * (it returns straight to the caller's continuation), so right-recursive loops such as the characters of a
 * string run in constant depth and come back to the very same node.
 *
 * Configurations. After some output the automaton can be in several stacks at once (alternatives not yet told
 * apart): the sorted set of "ready" stacks (top = a byte set) plus a flag "the whole grammar may end here".
 * Configurations are interned too, so a stream's position is (configuration id, bytes used) and rollback is an
 * assignment. Transitions (configuration, byte) -> configuration are computed once and cached per state.
 *
 * Masks. The vocabulary is a trie in preorder (constraint_vocab.h); a mask is one pass over it, following the
 * cached transitions from the current configuration and skipping the subtree of every dead prefix. Masks are
 * cached per configuration (the common case: inside a string the configuration repeats token after token).
 *
 * Context-independent masks. Caching by configuration alone would walk the whole trie again for every string
 * property (its stack below the string differs). So a cache miss first cuts off the part of the
 * stacks that all of them share (the context, below the innermost frame common to all; it becomes a wildcard)
 * and walks the trie on that: a token some truncated stack consumes without leaving its frames is allowed whatever the context; a
 * token every truncated stack refuses without leaving them is refused; a token on whose path some stack leaves
 * the frames is "uncertain" and is checked alone against the real configuration. The truncated walk is cached
 * and shared by every configuration with the same tops (all strings, say), so a new context costs only the
 * uncertain tokens (those with a closing quote, for a string). The exact answer is the same as a full walk.
 *
 * Length bound. Every configuration knows the fewest bytes that complete it (the sum of the shortest rests of
 * its frames, minimised over its stacks). A token is allowed only if used + its length + that minimum after it
 * stays within max_bytes; along a path the quantity depth + minimum never decreases (a byte shortens a
 * completion by at most one), so the trie walk may cut a subtree as soon as it exceeds the budget. */
#include "engine/constraint_vocab.h"
#include "util/error.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MASK_SLOTS 256           /* cached masks per state (16 KB each on a 129k vocabulary) */
#define MAX_CONFIGS (1 << 22)    /* beyond this the state reports out of memory rather than growing on */
#define T_UNKNOWN (-2)
#define T_FAIL (-3)
#define T_BUDGET (-4)            /* the token fits the grammar but not the length bound */
#define WILD (-2)                /* parent of a truncated stack's last kept frame: "some context" */
#define CI_SLOTS 64

typedef struct { int32_t pos, parent; } cnode;

typedef struct { int32_t *v; int64_t n, cap; } ivec;

static int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        const int64_t c = a->cap ? 2 * a->cap : 64;
        int32_t *p = realloc(a->v, sizeof *p * (size_t)c);
        if (!p) return -1;
        a->v = p;
        a->cap = c;
    }
    a->v[a->n++] = x;
    return 0;
}

/* Everything derived from (grammar, vocabulary) alone: interned stacks and configurations, transitions, mask
 * caches, scratch. Shared by any number of stream states (one thread at a time). */
struct dsv4_cmatcher {
    const dsv4_grammar *g;
    const dsv4_cvocab *v;
    int32_t start;               /* the configuration before any output */
    /* interned stack nodes */
    cnode *node;
    int64_t *node_min;           /* fewest bytes that complete the whole stack */
    uint32_t *node_seen;         /* closure stamp */
    int32_t n_node, cap_node;
    int32_t *nh;                 /* open addressing: node ids, -1 = empty */
    uint32_t nh_cap;
    /* interned configurations: items[off[c] .. off[c] + len[c]) are the ready stack nodes, sorted */
    ivec items;
    int64_t *cfg_off;
    int32_t *cfg_len;
    uint8_t *cfg_accept;
    uint8_t *cfg_escape;         /* a stack left its truncated frames here (truncated configurations only) */
    int32_t *cfg_ci;             /* truncated configurations: context-independent walk slot, or -1 */
    int64_t *cfg_min;
    int32_t **cfg_trans;         /* [256] per configuration, allocated on first use */
    int32_t *cfg_slot;           /* mask cache slot or -1 */
    int32_t n_cfg, cap_cfg;
    int32_t *ch;
    uint32_t ch_cap;
    /* mask cache */
    int words;
    uint64_t *pool;              /* [MASK_SLOTS][words] */
    int32_t slot_cfg[MASK_SLOTS];
    int64_t slot_need[MASK_SLOTS];
    int next_slot;
    uint64_t *bits;              /* [words] scratch */
    /* context-independent walks of truncated configurations */
    uint64_t *ci_bits;           /* [CI_SLOTS][words]: allowed whatever the context */
    int32_t *ci_ranges[CI_SLOTS];/* uncertain tokens: pairs [a, b) of indexes into the vocabulary's toks */
    int ci_n_ranges[CI_SLOTS], ci_cap_ranges[CI_SLOTS];
    int64_t ci_uncertain[CI_SLOTS], ci_need[CI_SLOTS];
    int32_t ci_cfg[CI_SLOTS];
    int next_ci;
    uint8_t *esc;                /* [max_depth + 1] walk scratch */
    /* scratch */
    ivec work, acc;
    uint32_t stamp;
    int32_t *dfs;                /* [max_depth + 1] */
    dsv4_cstate_stats st;
    int64_t n_trans_tables;      /* transition tables allocated (1 KB each) */
};

/* One stream: where its output is, and its length bound. */
struct dsv4_cstate {
    dsv4_cmatcher *m;
    int owns_matcher;
    int64_t max_bytes;           /* < 0: no bound */
    dsv4_cpos at;
};

static uint32_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* ---- stack nodes ------------------------------------------------------------------------------------------ */

static int node_rehash(dsv4_cmatcher *s) {
    const uint32_t cap = s->nh_cap ? 2 * s->nh_cap : 1024;
    int32_t *t = malloc(sizeof *t * cap);
    if (!t) return -1;
    memset(t, 0xff, sizeof *t * cap);
    for (int32_t i = 0; i < s->n_node; i++) {
        uint32_t h = mix(((uint64_t)(uint32_t)s->node[i].pos << 32) | (uint32_t)s->node[i].parent) & (cap - 1);
        while (t[h] >= 0) h = (h + 1) & (cap - 1);
        t[h] = i;
    }
    free(s->nh);
    s->nh = t;
    s->nh_cap = cap;
    return 0;
}

/* The node for (pos, parent), created when new; -1 when out of memory. */
static int32_t node_get(dsv4_cmatcher *s, int32_t pos, int32_t parent) {
    if ((uint32_t)(s->n_node + 1) * 2 > s->nh_cap && node_rehash(s)) return -1;
    uint32_t h = mix(((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent) & (s->nh_cap - 1);
    for (int32_t id; (id = s->nh[h]) >= 0; h = (h + 1) & (s->nh_cap - 1))
        if (s->node[id].pos == pos && s->node[id].parent == parent) return id;
    if (s->n_node == s->cap_node) {
        if (s->cap_node >= MAX_CONFIGS * 4) return -1;
        const int32_t c = s->cap_node ? 2 * s->cap_node : 1024;
        cnode *a = realloc(s->node, sizeof *a * (size_t)c);
        if (a) s->node = a;
        int64_t *b = realloc(s->node_min, sizeof *b * (size_t)c);
        if (b) s->node_min = b;
        uint32_t *d = realloc(s->node_seen, sizeof *d * (size_t)c);
        if (d) s->node_seen = d;
        if (!a || !b || !d) return -1;
        s->cap_node = c;
    }
    const int32_t id = s->n_node++;
    s->node[id] = (cnode){ pos, parent };
    s->node_min[id] = s->g->minrest[pos] + (parent >= 0 ? s->node_min[parent] : 0);
    s->node_seen[id] = 0;
    s->nh[h] = id;
    s->st.stack_nodes = s->n_node;
    return id;
}

/* ---- closure: from raw stacks to ready stacks ------------------------------------------------------------- */

static int visit(dsv4_cmatcher *s, int32_t id) {
    if (id < 0) return -1;
    if (s->node_seen[id] == s->stamp) return 0;
    s->node_seen[id] = s->stamp;
    return ivec_push(&s->work, id);
}

/* Expand every node on the work list until only byte sets are on top: a rule reference becomes each of its
 * alternatives (with the return frame below, unless the reference is in tail position); the end of an
 * alternative returns to its frame; the end of the bottom frame means the whole grammar may end here. The stamp
 * makes each (position, parent) visited once per closure, which also ends loops through empty alternatives. */
static int closure(dsv4_cmatcher *s, int *accept, int *escape) {
    const dsv4_grammar *g = s->g;
    while (s->work.n > 0) {
        const int32_t id = s->work.v[--s->work.n];
        const cnode n = s->node[id];
        const gelem e = g->el[n.pos];
        if (e.kind == GE_BYTES) {
            if (ivec_push(&s->acc, id)) return -1;
        } else if (e.kind == GE_END) {
            if (n.parent == WILD) *escape = 1;
            else if (n.parent < 0) *accept = 1;
            else if (visit(s, n.parent)) return -1;
        } else {
            int32_t ret = n.parent;
            if (g->el[n.pos + 1].kind != GE_END && (ret = node_get(s, n.pos + 1, n.parent)) < 0) return -1;
            for (int32_t a = g->alt_first[e.arg]; a < g->alt_first[e.arg + 1]; a++)
                if (visit(s, node_get(s, g->alt_pos[a], ret))) return -1;
        }
    }
    return 0;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint32_t cfg_hash(const int32_t *v, int64_t n, int flags) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)flags;
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint32_t)v[i]) * 0x100000001b3ULL;
    return mix(h);
}

static int cfg_rehash(dsv4_cmatcher *s) {
    const uint32_t cap = s->ch_cap ? 2 * s->ch_cap : 1024;
    int32_t *t = malloc(sizeof *t * cap);
    if (!t) return -1;
    memset(t, 0xff, sizeof *t * cap);
    for (int32_t c = 0; c < s->n_cfg; c++) {
        uint32_t h = cfg_hash(s->items.v + s->cfg_off[c], s->cfg_len[c], s->cfg_accept[c] | s->cfg_escape[c] << 1) & (cap - 1);
        while (t[h] >= 0) h = (h + 1) & (cap - 1);
        t[h] = c;
    }
    free(s->ch);
    s->ch = t;
    s->ch_cap = cap;
    return 0;
}

static int cfg_grow(dsv4_cmatcher *s) {
    if (s->cap_cfg >= MAX_CONFIGS) return -1;
    const int32_t c = s->cap_cfg ? 2 * s->cap_cfg : 256;
    int64_t *off = realloc(s->cfg_off, sizeof *off * (size_t)c);
    if (off) s->cfg_off = off;
    int32_t *len = realloc(s->cfg_len, sizeof *len * (size_t)c);
    if (len) s->cfg_len = len;
    uint8_t *acc = realloc(s->cfg_accept, (size_t)c);
    if (acc) s->cfg_accept = acc;
    uint8_t *esc = realloc(s->cfg_escape, (size_t)c);
    if (esc) s->cfg_escape = esc;
    int32_t *ci = realloc(s->cfg_ci, sizeof *ci * (size_t)c);
    if (ci) s->cfg_ci = ci;
    int64_t *mn = realloc(s->cfg_min, sizeof *mn * (size_t)c);
    if (mn) s->cfg_min = mn;
    int32_t **tr = realloc(s->cfg_trans, sizeof *tr * (size_t)c);
    if (tr) s->cfg_trans = tr;
    int32_t *sl = realloc(s->cfg_slot, sizeof *sl * (size_t)c);
    if (sl) s->cfg_slot = sl;
    if (!off || !len || !acc || !esc || !ci || !mn || !tr || !sl) return -1;
    s->cap_cfg = c;
    return 0;
}

/* Intern the configuration (s->acc, accept, escape); returns its id or T_FAIL. */
static int32_t cfg_get(dsv4_cmatcher *s, int accept, int escape) {
    int32_t *v = s->acc.v;
    int64_t n = s->acc.n;
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_i32);   /* v is NULL while nothing was ever collected */
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (!u || v[i] != v[u - 1]) v[u++] = v[i];
    s->acc.n = n = u;
    if ((uint32_t)(s->n_cfg + 1) * 2 > s->ch_cap && cfg_rehash(s)) return T_FAIL;
    const int flags = accept | escape << 1;
    uint32_t h = cfg_hash(v, n, flags) & (s->ch_cap - 1);
    for (int32_t c; (c = s->ch[h]) >= 0; h = (h + 1) & (s->ch_cap - 1))
        if (s->cfg_len[c] == n && s->cfg_accept[c] == accept && s->cfg_escape[c] == escape &&
            (n == 0 || !memcmp(s->items.v + s->cfg_off[c], v, sizeof *v * (size_t)n)))
            return c;
    if (s->n_cfg == s->cap_cfg && cfg_grow(s)) return T_FAIL;
    const int32_t c = s->n_cfg;
    const int64_t off = s->items.n;
    for (int64_t i = 0; i < n; i++)
        if (ivec_push(&s->items, s->acc.v[i])) return T_FAIL;
    int64_t mn = accept ? 0 : INT64_MAX;
    for (int64_t i = 0; i < n; i++)
        if (s->node_min[s->acc.v[i]] < mn) mn = s->node_min[s->acc.v[i]];
    s->cfg_off[c] = off;
    s->cfg_len[c] = (int32_t)n;
    s->cfg_accept[c] = (uint8_t)accept;
    s->cfg_escape[c] = (uint8_t)escape;
    s->cfg_ci[c] = -1;
    s->cfg_min[c] = mn;
    s->cfg_trans[c] = NULL;
    s->cfg_slot[c] = -1;
    s->ch[h] = c;
    s->n_cfg++;
    s->st.configs = s->n_cfg;
    return c;
}

/* The configuration after reading byte b in configuration c: -1 dead, T_FAIL out of memory. */
static int32_t step_byte(dsv4_cmatcher *s, int32_t c, unsigned b) {
    int32_t *tr = s->cfg_trans[c];
    if (!tr) {
        if (!(tr = malloc(sizeof *tr * 256))) return T_FAIL;
        for (int i = 0; i < 256; i++) tr[i] = T_UNKNOWN;
        s->cfg_trans[c] = tr;
        s->n_trans_tables++;
    }
    if (tr[b] != T_UNKNOWN) return tr[b];
    s->st.transitions++;
    const dsv4_grammar *g = s->g;
    s->stamp++;
    s->work.n = s->acc.n = 0;
    int accept = 0, escape = 0;
    const int64_t off = s->cfg_off[c];
    const int32_t len = s->cfg_len[c];
    for (int32_t i = 0; i < len; i++) {
        const cnode n = s->node[s->items.v[off + i]];
        if (gb_set_has(&g->sets[g->el[n.pos].arg], b) && visit(s, node_get(s, n.pos + 1, n.parent))) return T_FAIL;
    }
    if (closure(s, &accept, &escape)) return T_FAIL;
    const int32_t next = s->acc.n == 0 && !accept && !escape ? -1 : cfg_get(s, accept, escape);
    if (next == T_FAIL) return T_FAIL;
    s->cfg_trans[c][b] = next; /* cfg_trans may have moved; the table itself did not */
    return next;
}

/* ---- lifetime -------------------------------------------------------------------------------------------- */

void dsv4_cmatcher_free(dsv4_cmatcher *s) {
    if (!s) return;
    for (int32_t c = 0; c < s->n_cfg; c++) free(s->cfg_trans[c]);
    free(s->node); free(s->node_min); free(s->node_seen); free(s->nh);
    free(s->items.v); free(s->cfg_off); free(s->cfg_len); free(s->cfg_accept); free(s->cfg_min);
    free(s->cfg_trans); free(s->cfg_slot); free(s->ch);
    for (int i = 0; i < CI_SLOTS; i++) free(s->ci_ranges[i]);
    free(s->ci_bits); free(s->esc); free(s->cfg_escape); free(s->cfg_ci);
    free(s->pool); free(s->bits); free(s->work.v); free(s->acc.v); free(s->dfs);
    free(s);
}

int dsv4_cmatcher_new(const dsv4_grammar *g, const dsv4_cvocab *v, dsv4_cmatcher **out, dsv4_error *err) {
    *out = NULL;
    if (!g || !v) return dsv4_fail(err, DSV4_E_ARG, "constraint: no grammar or vocabulary");
    dsv4_cmatcher *s = calloc(1, sizeof *s);
    if (!s) return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory");
    s->g = g;
    s->v = v;
    s->words = (v->n_vocab + 63) / 64;
    s->pool = malloc(sizeof *s->pool * (size_t)s->words * MASK_SLOTS);
    s->bits = malloc(sizeof *s->bits * (size_t)s->words);
    s->dfs = malloc(sizeof *s->dfs * (size_t)(v->max_depth + 1));
    s->esc = malloc((size_t)(v->max_depth + 1));
    s->ci_bits = malloc(sizeof *s->ci_bits * (size_t)s->words * CI_SLOTS);
    for (int i = 0; i < MASK_SLOTS; i++) s->slot_cfg[i] = -1;
    for (int i = 0; i < CI_SLOTS; i++) s->ci_cfg[i] = -1;
    if (!s->pool || !s->bits || !s->dfs || !s->esc || !s->ci_bits) goto nomem;
    /* the start: every alternative of the root rule, bottom of the stack */
    s->stamp = 1;
    int accept = 0, escape = 0;
    for (int32_t a = g->alt_first[g->root]; a < g->alt_first[g->root + 1]; a++)
        if (visit(s, node_get(s, g->alt_pos[a], -1))) goto nomem;
    if (closure(s, &accept, &escape)) goto nomem;
    if ((s->start = cfg_get(s, accept, 0)) < 0) goto nomem;
    *out = s;
    return 0;
nomem:
    dsv4_cmatcher_free(s);
    return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory");
}

int dsv4_cstate_new_shared(dsv4_cmatcher *m, int64_t max_bytes, dsv4_cstate **out, dsv4_error *err) {
    *out = NULL;
    if (!m) return dsv4_fail(err, DSV4_E_ARG, "constraint: no matcher");
    dsv4_cstate *st = calloc(1, sizeof *st);
    if (!st) return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory");
    *st = (dsv4_cstate){ m, 0, max_bytes, { m->start, 0 } };
    *out = st;
    return 0;
}

int dsv4_cstate_new(const dsv4_grammar *g, const dsv4_cvocab *v, int64_t max_bytes, dsv4_cstate **out, dsv4_error *err) {
    dsv4_cmatcher *m;
    int rc = dsv4_cmatcher_new(g, v, &m, err);
    if (rc) { *out = NULL; return rc; }
    if ((rc = dsv4_cstate_new_shared(m, max_bytes, out, err))) { dsv4_cmatcher_free(m); return rc; }
    (*out)->owns_matcher = 1;
    return 0;
}

void dsv4_cstate_free(dsv4_cstate *st) {
    if (!st) return;
    if (st->owns_matcher) dsv4_cmatcher_free(st->m);
    free(st);
}

/* ---- single tokens --------------------------------------------------------------------------------------- */

/* The configuration after token id's bytes from configuration c with `left` bytes of budget: -1 dead, T_BUDGET
 * when it fits the grammar but not the bound, T_FAIL out of memory. */
static int32_t token_from(dsv4_cmatcher *s, int32_t c, int32_t id, int64_t left) {
    size_t len;
    const char *b = dsv4_cvocab_bytes(s->v, id, &len);
    if (!b || c < 0) return -1;
    for (size_t i = 0; i < len && c >= 0; i++) c = step_byte(s, c, (unsigned char)b[i]);
    if (c < 0) return c;
    if ((int64_t)len + s->cfg_min[c] > left) return T_BUDGET;
    return c;
}

static int64_t remaining(const dsv4_cstate *st) { return st->max_bytes < 0 ? INT64_MAX : st->max_bytes - st->at.used; }
static int32_t after_token(dsv4_cstate *st, int32_t id) { return token_from(st->m, st->at.cfg, id, remaining(st)); }

/* ---- masks ------------------------------------------------------------------------------------------------ */


/* One pass over the vocabulary trie from configuration c0 with `left` bytes of budget: the allowed tokens into
 * bits (EOS excluded). *pruned = the budget cut something; *need = the largest depth + completion seen, so the
 * same mask holds for any budget >= *need when nothing was cut. Returns the number of tokens allowed, or -1 when
 * out of memory. */
static int64_t walk(dsv4_cmatcher *s, int32_t c0, int64_t left, uint64_t *bits, int *pruned, int64_t *need) {
    const dsv4_cvocab *v = s->v;
    memset(bits, 0, sizeof *bits * (size_t)s->words);
    /* the vocabulary's arrays in locals: the bit stores below must not make the compiler reload them */
    const uint16_t *depth = v->depth;
    const uint8_t *byte = v->byte;
    const int32_t *end = v->end, *tok_first = v->tok_first, *toks = v->toks;
    const int32_t n_node = v->n_node;
    int64_t count = 0, visited = 0, nd_max = 0;
    int cut = 0;
    int32_t *dfs = s->dfs;
    dfs[0] = c0;
    const int64_t *cmin = s->cfg_min; /* reloaded after step_byte, which may grow the tables */
    for (int32_t i = 1; i < n_node;) {
        const int d = depth[i];
        const int32_t pc = dfs[d - 1];
        const int32_t *tr = s->cfg_trans[pc];
        int32_t c = tr ? tr[byte[i]] : T_UNKNOWN;
        if (c == T_UNKNOWN) {
            c = step_byte(s, pc, byte[i]);
            cmin = s->cfg_min;
        }
        if (c == T_FAIL) return -1;
        if (c < 0) { i = end[i]; continue; }
        const int64_t nd = d + cmin[c];
        if (nd > left) { cut = 1; i = end[i]; continue; }
        if (nd > nd_max) nd_max = nd;
        dfs[d] = c;
        visited++;
        for (int32_t k = tok_first[i]; k < tok_first[i + 1]; k++) {
            const int32_t id = toks[k];
            bits[id >> 6] |= 1ULL << (id & 63);
            count++;
        }
        i++;
    }
    s->st.trie_nodes_visited += visited;
    *pruned = cut;
    *need = nd_max;
    return count;
}

/* ---- context-independent walks ---------------------------------------------------------------------------- */

/* c with its shared context cut off: the deepest stack node every stack of c passes through (the frame all
 * alternatives return to, such as the continuation after a string) keeps its position but gets the parent
 * WILD. Configurations that differ only below that node (a string in one property or another) truncate to the
 * same configuration. *ccut = the completion of the cut-off context, so that a completion on the truncated
 * stacks plus *ccut is the real one. Returns the truncated configuration (c itself when its stacks share no
 * node) or T_FAIL. */
static int32_t truncate_cfg(dsv4_cmatcher *s, int32_t c, int64_t *ccut) {
    *ccut = 0;
    const int64_t off = s->cfg_off[c];
    const int32_t len = s->cfg_len[c];
    if (len == 0) return c;
    /* the first stack's chain; `best` indexes the deepest-so-far common node in it */
    s->work.n = 0;
    for (int32_t y = s->items.v[off]; y >= 0; y = s->node[y].parent)
        if (ivec_push(&s->work, y)) return T_FAIL;
    int64_t best = 0;
    for (int32_t i = 1; i < len && best < s->work.n; i++) {
        int64_t hit = s->work.n;
        for (int32_t y = s->items.v[off + i]; y >= 0 && hit == s->work.n; y = s->node[y].parent)
            for (int64_t j = best; j < s->work.n; j++)
                if (s->work.v[j] == y) { hit = j; break; }
        best = hit;
    }
    if (best >= s->work.n) return c;
    const int32_t common = s->work.v[best], below = s->node[common].parent;
    if (below < 0) return c; /* nothing to cut */
    *ccut = s->node_min[below];
    const int32_t base = node_get(s, s->node[common].pos, WILD);
    if (base < 0) return T_FAIL;
    s->acc.n = 0;
    int32_t chain[256];
    for (int32_t i = 0; i < len; i++) {
        int k = 0;
        int32_t y = s->items.v[off + i];
        for (; y != common && k < 256; y = s->node[y].parent) chain[k++] = y;
        if (y != common) return c; /* deeper than the scratch: use the configuration as it is */
        int32_t nid = base;
        for (int j = k - 1; j >= 0; j--)
            if ((nid = node_get(s, s->node[chain[j]].pos, nid)) < 0) return T_FAIL;
        if (ivec_push(&s->acc, nid)) return T_FAIL;
    }
    return cfg_get(s, 0, 0); /* a stack through `common` cannot end the whole output: not accepting */
}

static int add_range(dsv4_cmatcher *s, int slot, int32_t a, int32_t b) {
    if (a >= b) return 0;
    s->ci_uncertain[slot] += b - a;
    int n = s->ci_n_ranges[slot];
    if (n > 0 && s->ci_ranges[slot][2 * n - 1] == a) { s->ci_ranges[slot][2 * n - 1] = b; return 0; }
    if (n == s->ci_cap_ranges[slot]) {
        const int cap = n ? 2 * n : 64;
        int32_t *r = realloc(s->ci_ranges[slot], sizeof *r * 2 * (size_t)cap);
        if (!r) return -1;
        s->ci_ranges[slot] = r;
        s->ci_cap_ranges[slot] = cap;
    }
    s->ci_ranges[slot][2 * n] = a;
    s->ci_ranges[slot][2 * n + 1] = b;
    s->ci_n_ranges[slot] = n + 1;
    return 0;
}

/* The trie walk of truncated configuration tc into a slot: tokens allowed in any context (bits), tokens whose
 * path leaves the frames (ranges), and the largest depth + truncated completion of an allowed token (need). */
static int ci_walk(dsv4_cmatcher *s, int32_t tc, int slot) {
    const dsv4_cvocab *v = s->v;
    uint64_t *bits = s->ci_bits + (size_t)slot * s->words;
    memset(bits, 0, sizeof *bits * (size_t)s->words);
    s->ci_n_ranges[slot] = 0;
    s->ci_uncertain[slot] = 0;
    const uint16_t *depth = v->depth;
    const uint8_t *byte = v->byte;
    const int32_t *end = v->end, *tok_first = v->tok_first, *toks = v->toks;
    const int32_t n_node = v->n_node;
    int64_t need = 0, visited = 0;
    int32_t *dfs = s->dfs;
    uint8_t *esc = s->esc;
    dfs[0] = tc;
    esc[0] = s->cfg_escape[tc];
    s->st.mask_walks++;
    /* reloaded after step_byte, which may grow the tables */
    const int64_t *cmin = s->cfg_min;
    const int32_t *clen = s->cfg_len;
    const uint8_t *cacc = s->cfg_accept, *cesc = s->cfg_escape;
    for (int32_t i = 1; i < n_node;) {
        const int d = depth[i];
        const int32_t pc = dfs[d - 1];
        const int32_t *tr = s->cfg_trans[pc];
        int32_t c = tr ? tr[byte[i]] : T_UNKNOWN;
        if (c == T_UNKNOWN) {
            c = step_byte(s, pc, byte[i]);
            cmin = s->cfg_min;
            clen = s->cfg_len;
            cacc = s->cfg_accept;
            cesc = s->cfg_escape;
        }
        if (c == T_FAIL) return -1;
        const int e = esc[d - 1] || (c >= 0 && cesc[c]);
        if (c < 0 || (clen[c] == 0 && !cacc[c])) {
            /* dead inside the frames: the subtree is refused, or uncertain if a stack left them on the way */
            if (e && add_range(s, slot, tok_first[i], tok_first[end[i]])) return -1;
            i = end[i];
            continue;
        }
        const int64_t nd = d + cmin[c];
        if (nd > need) need = nd;
        dfs[d] = c;
        esc[d] = (uint8_t)e;
        visited++;
        for (int32_t k = tok_first[i]; k < tok_first[i + 1]; k++) {
            const int32_t id = toks[k];
            bits[id >> 6] |= 1ULL << (id & 63);
        }
        i++;
    }
    s->st.trie_nodes_visited += visited;
    s->ci_need[slot] = need;
    return 0;
}

/* The mask of real configuration c from the context-independent walk of its truncation: into s->bits, with
 * *count tokens, *need (the budget it holds for) and *cut (the budget refused an uncertain token). Returns 1
 * when done, 0 when the full walk is the better way (too many uncertain tokens, or a budget too tight for the
 * bound), -1 when out of memory. */
static int ci_mask(dsv4_cmatcher *s, int32_t c, int64_t left, int64_t *count, int64_t *need, int *cut) {
    int64_t ccut;
    const int32_t tc = truncate_cfg(s, c, &ccut);
    if (tc < 0) return -1;
    int slot = s->cfg_ci[tc];
    if (slot < 0) {
        slot = s->next_ci;
        s->next_ci = (s->next_ci + 1) % CI_SLOTS;
        if (s->ci_cfg[slot] >= 0) s->cfg_ci[s->ci_cfg[slot]] = -1;
        s->ci_cfg[slot] = tc;
        s->cfg_ci[tc] = slot;
        if (ci_walk(s, tc, slot)) { s->cfg_ci[tc] = -1; s->ci_cfg[slot] = -1; return -1; }
    }
    if (s->ci_uncertain[slot] > s->v->n_vocab / 8 || left - ccut < s->ci_need[slot]) return 0;
    memcpy(s->bits, s->ci_bits + (size_t)slot * s->words, sizeof *s->bits * (size_t)s->words);
    *need = s->ci_need[slot] + ccut;
    *cut = 0;
    const int32_t *toks = s->v->toks;
    for (int r = 0; r < s->ci_n_ranges[slot]; r++)
        for (int32_t k = s->ci_ranges[slot][2 * r]; k < s->ci_ranges[slot][2 * r + 1]; k++) {
            const int32_t id = toks[k];
            const int32_t after = token_from(s, c, id, left);
            if (after == T_FAIL) return -1;
            if (after == T_BUDGET) *cut = 1;
            if (after < 0) continue;
            s->bits[id >> 6] |= 1ULL << (id & 63);
            const int64_t nd = (int64_t)s->v->len[id] + s->cfg_min[after];
            if (nd > *need) *need = nd;
        }
    int64_t n = 0;
    for (int w = 0; w < s->words; w++) n += __builtin_popcountll(s->bits[w]);
    *count = n;
    return 1;
}

/* The current mask (EOS included): cached, or walked (and cached when the budget cut nothing). NULL when out
 * of memory. */
static const uint64_t *current_mask(dsv4_cstate *st) {
    dsv4_cmatcher *s = st->m;
    if (st->at.cfg < 0) { memset(s->bits, 0, sizeof *s->bits * (size_t)s->words); return s->bits; }
    const int32_t c = st->at.cfg;
    const int64_t left = remaining(st);
    const int32_t slot = s->cfg_slot[c];
    if (slot >= 0 && left >= s->slot_need[slot]) { s->st.mask_hits++; return s->pool + (size_t)slot * s->words; }
    int pruned;
    int64_t need, count;
    const int ci = ci_mask(s, c, left, &count, &need, &pruned);
    if (ci < 0) return NULL;
    if (!ci) {
        if ((count = walk(s, c, left, s->bits, &pruned, &need)) < 0) return NULL;
        s->st.mask_walks++;
    }
    const int32_t eos = s->v->eos;
    /* EOS when the value is complete; and when nothing else fits (a budget below the shortest value), so that
     * the stream can always end */
    if (s->cfg_accept[c] || count == 0) s->bits[eos >> 6] |= 1ULL << (eos & 63);
    if (pruned) return s->bits;
    const int k = slot >= 0 ? slot : s->next_slot;
    if (slot < 0) {
        s->next_slot = (s->next_slot + 1) % MASK_SLOTS;
        if (s->slot_cfg[k] >= 0) s->cfg_slot[s->slot_cfg[k]] = -1;
        s->slot_cfg[k] = c;
        s->cfg_slot[c] = k;
    }
    s->slot_need[k] = need;
    uint64_t *dst = s->pool + (size_t)k * s->words;
    memcpy(dst, s->bits, sizeof *dst * (size_t)s->words);
    return dst;
}

int dsv4_cstate_allowed(dsv4_cstate *st, uint64_t *bits, dsv4_error *err) {
    const uint64_t *m = current_mask(st);
    if (!m) return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory (automaton too large)");
    memcpy(bits, m, sizeof *bits * (size_t)st->m->words);
    return 0;
}

int dsv4_cstate_mask(dsv4_cstate *st, float *logits, dsv4_error *err) {
    const uint64_t *m = current_mask(st);
    if (!m) return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory (automaton too large)");
    const int32_t V = st->m->v->n_vocab;
    for (int w = 0; w < st->m->words; w++) {
        const uint64_t b = m[w];
        if (b == ~0ULL) continue;
        const int32_t base = w * 64, top = base + 64 < V ? base + 64 : V;
        for (int32_t i = base; i < top; i++)
            if (!((b >> (i - base)) & 1)) logits[i] = -INFINITY;
    }
    return 0;
}

int dsv4_cstate_allows(dsv4_cstate *st, int32_t id) {
    const dsv4_cvocab *v = st->m->v;
    if (st->at.cfg < 0 || id < 0 || id >= v->n_vocab) return 0;
    if (id == v->eos) {
        if (st->m->cfg_accept[st->at.cfg]) return 1;
        const uint64_t *m = current_mask(st); /* EOS is also the way out when nothing else fits */
        return m && ((m[id >> 6] >> (id & 63)) & 1);
    }
    return after_token(st, id) >= 0;
}

int dsv4_cstate_advance(dsv4_cstate *st, int32_t id, dsv4_error *err) {
    if (st->at.cfg < 0) return dsv4_fail(err, DSV4_E_ARG, "constraint: token %d after the end of the output", id);
    const dsv4_cvocab *v = st->m->v;
    if (id < 0 || id >= v->n_vocab) return dsv4_fail(err, DSV4_E_ARG, "constraint: token %d is outside the vocabulary", id);
    if (id == v->eos) {
        if (!dsv4_cstate_allows(st, id))
            return dsv4_fail(err, DSV4_E_ARG, "constraint: end of sequence before the output is complete");
        st->at.cfg = -1;
        return 0;
    }
    const int32_t c = after_token(st, id);
    if (c == T_FAIL) return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory (automaton too large)");
    if (c == T_BUDGET) return dsv4_fail(err, DSV4_E_ARG, "constraint: token %d does not fit the length bound here", id);
    if (c < 0) return dsv4_fail(err, DSV4_E_ARG, "constraint: token %d does not fit the grammar here", id);
    st->at.cfg = c;
    st->at.used += (int64_t)v->len[id];
    return 0;
}

int dsv4_cstate_complete(const dsv4_cstate *st) { return st->at.cfg >= 0 && st->m->cfg_accept[st->at.cfg]; }
int dsv4_cstate_finished(const dsv4_cstate *st) { return st->at.cfg < 0; }
dsv4_cpos dsv4_cstate_get(const dsv4_cstate *st) { return st->at; }
void dsv4_cstate_set(dsv4_cstate *st, dsv4_cpos p) { st->at = p; }
void dsv4_cstate_get_stats(const dsv4_cstate *st, dsv4_cstate_stats *out) { *out = st->m->st; }
dsv4_cmatcher *dsv4_cstate_matcher(dsv4_cstate *st) { return st->m; }
const dsv4_cvocab *dsv4_cmatcher_vocab(const dsv4_cmatcher *m) { return m->v; }

size_t dsv4_cmatcher_bytes(const dsv4_cmatcher *m) {
    size_t b = sizeof *m;
    b += (size_t)m->cap_node * (sizeof(cnode) + sizeof(int64_t) + sizeof(uint32_t)) + (size_t)m->nh_cap * sizeof(int32_t);
    b += (size_t)m->cap_cfg * (sizeof(int64_t) * 2 + sizeof(int32_t) * 3 + 2 + sizeof(int32_t *)) + (size_t)m->ch_cap * sizeof(int32_t);
    b += (size_t)m->items.cap * sizeof(int32_t) + (size_t)m->n_trans_tables * 256 * sizeof(int32_t);
    b += sizeof(uint64_t) * (size_t)m->words * (MASK_SLOTS + CI_SLOTS + 1);
    for (int i = 0; i < CI_SLOTS; i++) b += (size_t)m->ci_cap_ranges[i] * 2 * sizeof(int32_t);
    return b;
}
