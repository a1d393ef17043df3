/* The token mask on top of the matcher's automaton (constraint_pda.h: stacks, configurations, transitions).
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
 * A counted repetition (a string before its maxLength, x{1,300}, a key's characters) gets the same kind of
 * answer without a walk, from per-token tables of its x (constraint_count.c); a walk that is shared between
 * configurations that behave alike (constraint_sig.c) serves the rest.
 *
 * Length bound. Every configuration knows the fewest bytes that complete it (the sum of the shortest rests of
 * its frames, minimised over its stacks). A token is allowed only if used + its length + that minimum after it
 * stays within max_bytes; along a path the quantity depth + minimum never decreases (a byte shortens a
 * completion by at most one), so the trie walk may cut a subtree as soon as it exceeds the budget. */
#include "engine/constraint_pda.h"
#include "util/error.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One stream: where its output is, and its length bound. */
struct dsv4_cstate {
    dsv4_cmatcher *m;
    int owns_matcher;
    int64_t max_bytes;           /* < 0: no bound */
    dsv4_cpos at;
};

/* ---- lifetime -------------------------------------------------------------------------------------------- */

void dsv4_cmatcher_free(dsv4_cmatcher *s) {
    if (!s) return;
    count_free(s);
    pda_free(s);
    sig_free(s);
    for (int i = 0; i < CI_SLOTS; i++) free(s->ci_ranges[i]);
    free(s->ci_bits); free(s->esc);
    free(s->pool); free(s->bits); free(s->dfs);
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
    s->special_id = malloc(sizeof *s->special_id * (size_t)(g->n_special + 1));
    if (s->special_id)
        for (int32_t k = 0; k < g->n_special; k++)
            if ((s->special_id[k] = dsv4_cvocab_special_id(v, g->special[k])) < 0) {
                dsv4_cmatcher_free(s);
                return dsv4_fail(err, DSV4_E_ARG, "constraint: the grammar names the special token '%s', which the vocabulary does not have",
                                 g->special[k]);
            }
    if (!s->pool || !s->bits || !s->dfs || !s->esc || !s->ci_bits || !s->special_id || sig_init(s) || pda_init(s)) {
        dsv4_cmatcher_free(s);
        return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory");
    }
    *out = s;
    return 0;
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
/* The index of special token id among the grammar's, or -1. */
static int32_t special_of(const dsv4_cmatcher *s, int32_t id) {
    for (int32_t k = 0; k < s->g->n_special; k++)
        if (s->special_id[k] == id) return k;
    return -1;
}

/* Bytes of the length bound token id takes: its length, or 1 for a special token. */
static int64_t units(const dsv4_cmatcher *s, int32_t id) { return s->v->bytes[id] ? (int64_t)s->v->len[id] : 1; }

static int32_t token_from(dsv4_cmatcher *s, int32_t c, int32_t id, int64_t left) {
    size_t len;
    const char *b = dsv4_cvocab_bytes(s->v, id, &len);
    if (c < 0) return -1;
    if (!b) {
        const int32_t k = special_of(s, id);
        if (k < 0) return -1;
        if ((c = pda_step_special(s, c, k)) < 0) return c;
        return 1 + s->cfg_min[c] > left ? T_BUDGET : c;
    }
    for (size_t i = 0; i < len && c >= 0; i++) c = pda_step_byte(s, c, (unsigned char)b[i]);
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
            c = pda_step_byte(s, pc, byte[i]);
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

/* ---- context-independent walks (constraint_sig.c) ---------------------------------------------------------- */

/* The mask of real configuration c from the context-independent walk of its truncation: into s->bits, with
 * *count tokens, *need (the budget it holds for) and *cut (the budget refused an uncertain token). Returns 1
 * when done, 0 when the full walk is the better way (too many uncertain tokens, or a budget too tight for the
 * bound), -1 when out of memory. */
/* A CI slot for configuration key (the least recently claimed one). */
static int ci_claim(dsv4_cmatcher *s, int32_t key) {
    const int slot = s->next_ci;
    s->next_ci = (s->next_ci + 1) % CI_SLOTS;
    if (s->ci_cfg[slot] >= 0) s->cfg_ci[s->ci_cfg[slot]] = -1;
    s->ci_cfg[slot] = key;
    s->cfg_ci[key] = slot;
    s->ci_ct[slot] = NULL;   /* set by a closed form that fills it */
    return slot;
}

static void ci_release(dsv4_cmatcher *s, int slot) {
    if (s->ci_cfg[slot] >= 0) s->cfg_ci[s->ci_cfg[slot]] = -1;
    s->ci_cfg[slot] = -1;
}

static int ci_mask(dsv4_cmatcher *s, int32_t c, int64_t left, int64_t *count, int64_t *need, int *cut) {
    int64_t ccut = 0;
    int slot = s->cfg_ci[c];     /* c's own closed form (below), or c is its own truncation */
    if (slot < 0) {
        const int32_t tc = pda_truncate(s, c, &ccut);
        if (tc < 0) return -1;
        slot = s->cfg_ci[tc];
        if (slot < 0) {
            /* a counted repetition's closed form (constraint_count.c), else the walk (constraint_sig.c) */
            slot = ci_claim(s, tc);
            int32_t key = tc;
            int rc = count_fill(s, tc, slot, 0);
            if (rc == 0 && tc != c && (rc = count_fill(s, c, slot, 0)) == 1) key = c;
            if (rc == 1) s->st.mask_walks++;
            else if (rc == 0) rc = ci_fill(s, tc, c, slot, &key) ? -1 : 1;
            if (rc < 0) { ci_release(s, slot); return -1; }
            if (key != tc) {   /* c's own closed form: kept for c alone */
                ci_release(s, slot);
                s->ci_cfg[slot] = c;
                s->cfg_ci[c] = slot;
                ccut = 0;
            }
        }
        if (s->ci_uncertain[slot] > s->v->n_vocab / 8 && tc != c && s->ci_cfg[slot] == tc) {
            /* the truncation left most tokens to c: every stack of c passes through a counted repetition's
             * frame (its first, mandatory characters) or one literal byte before it, so the truncation cut off
             * what follows it. The closed form of c itself, kept for c alone, when c has one. */
            const int own = ci_claim(s, c);
            int rc = count_fill(s, c, own, 1);
            if (rc == 0) rc = count_fill_after_byte(s, c, own);   /* or one byte before such a start */
            if (rc < 0) { ci_release(s, own); return -1; }
            if (rc == 0) ci_release(s, own);
            else { s->st.mask_walks++; slot = own; ccut = 0; }
        }
    }
    if (s->ci_uncertain[slot] > s->v->n_vocab / 8) return 0;
    *cut = 0;
    if (left - ccut >= s->ci_need[slot]) {
        memcpy(s->bits, s->ci_bits + (size_t)slot * s->words, sizeof *s->bits * (size_t)s->words);
        *need = s->ci_need[slot] + ccut;
    } else if (s->ci_ct[slot]) {
        /* a closed form below its budget (the end of a length bound): its tokens that still fit, one by one */
        if (count_budget(s, slot, left - ccut, s->bits, need, cut)) return -1;
        *need += ccut;
    } else return 0;   /* a walk's answer holds for its budget only: the full walk */
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
    /* the special tokens the grammar names: a handful, checked one by one against the real configuration */
    for (int32_t k = 0; k < s->g->n_special; k++) {
        const int32_t after = pda_step_special(s, c, k);
        if (after == T_FAIL) return NULL;
        if (after < 0) continue;
        if (1 + s->cfg_min[after] > left) { pruned = 1; continue; }
        const int32_t id = s->special_id[k];
        s->bits[id >> 6] |= 1ULL << (id & 63);
        count++;
        if (1 + s->cfg_min[after] > need) need = 1 + s->cfg_min[after];
    }
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
    st->at.used += units(st->m, id);
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
    b += pda_bytes(m) + sig_bytes(m) + count_bytes(m);
    b += sizeof(uint64_t) * (size_t)m->words * (MASK_SLOTS + CI_SLOTS + 1);
    for (int i = 0; i < CI_SLOTS; i++) b += (size_t)m->ci_cap_ranges[i] * 2 * sizeof(int32_t);
    return b;
}
