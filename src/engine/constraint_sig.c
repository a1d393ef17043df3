/* Context-independent walks shared by configurations that behave alike.
 *
 * Why. A context-independent walk (constraint.c) is one pass over the vocabulary trie from a truncated
 * configuration: ~270k nodes, 2-4 ms on the real vocabulary when most tokens are alive (inside a string). It
 * is cached per truncated configuration, but a counted repetition (maxLength, x{1,300}) is a new configuration
 * at every character, so the first request with such a schema walked the whole trie at every token.
 *
 * What decides a walk. A walk classifies each token (allowed / refused / uncertain) from the configurations
 * met along its bytes only: for each, whether it escaped the truncated frames and whether it is dead inside
 * them (constraint.c). So a stored walk from configuration A answers for configuration B wherever B's
 * automaton simulates A's on the transitions the walk read. A stored walk keeps:
 *   its read set: the configurations it met, numbered, their flags, and for each the bytes it read there and
 *     the numbered configuration (or death) each led to;
 *   its result: allowed tokens, uncertain subtrees (with the depth of their root), per configuration the
 *     depths of the alive nodes where it was met, and the configuration at every alive node of depth
 *     <= CV_SIG_DEPTH.
 *
 * Checking B against a stored walk: a breadth-first search over pairs (stored configuration k, configuration c
 * of B), from (0, B), along the read set: for each byte k read, c must go where k went (dead where k died; same
 * flags where k lived). Every pair (k, c) that meets at a trie node of depth d is found at distance <= d, so if
 * the first failure is at distance r, every token of at most r bytes gets the stored answer (r = infinity past
 * the longest token: the whole walk is B's). The search may relate pairs that never meet at a node; that only
 * makes r smaller (never wrong). It reads only transitions the walk of B would read anyway.
 *
 * Using it (ci_fill), in this order:
 *   whole (no failure): copy the result. E.g. a string at 40 characters before its maxLength behaves like
 *     a plain string for every token (none is 40 bytes long), and count k + 1 of x{1,300} like count k. The
 *     vocabulary's stored walks (plain JSON strings, made once by dsv4_cvocab_prepare_json, read-only) are
 *     tried before the matcher's own.
 *   narrow configurations (few alive tokens: after '{', in a number) are then walked plainly (a probe that
 *     ends within PROBE_LIMIT nodes): nothing to share, and storing them would push the wide walks out.
 *   partial (failure at r): tokens of at most r bytes from the stored result (bits & len_le[r], uncertain
 *     subtrees rooted at depth <= r), and the walk continues from B's configurations at the depth-r nodes into
 *     the deeper ones. B's configuration at a node is known when each stored configuration met within depth r
 *     pairs with one configuration of B only (count k + 1 of x{1,300} against count k: yes; a string against an
 *     unbounded string, whose one loop configuration pairs with every count: no). A continuation that grows
 *     past PARTIAL_LIMIT nodes gives up for a plain walk (a string a few UTF-8 characters before its maxLength
 *     is alive deep below the depth where it parts), and a later partial no deeper is not tried.
 *   otherwise B's own walk, stored (least recently used slot), on a dense table of numbered configurations
 *     filled as it goes; unless B parts from a stored walk only a few bytes down (2 <= r < CV_SIG_DEPTH: a
 *     string near its bound, whose walk would serve nothing else): then a plain walk (~15 % cheaper).
 *
 * The completion minimum (the `need` of a walk) differs between configurations that behave alike (a string in
 * one property or another), so it is not part of the check: B's need is bounded by the largest depth of an
 * alive node with stored configuration k plus the minimum of the configuration of B it pairs with, over the
 * pairs found. An upper bound only makes the budget check more careful.
 *
 * Exactness: tests/unit/test_constraint_shared.c compares every mask with the brute force (each token's own
 * answer), with the probe off so that every path here runs on a small vocabulary; the grammar and json_schema
 * fuzz targets run a shadow stream through these paths and compare every mask (tests/fuzz/lib/constraint_walk.c). */
#include "engine/constraint_pda.h"
#include "engine/json_schema.h"
#include "util/error.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define SIG_SLOTS 8              /* stored walks per matcher (each ~0.6 MB on a 129k vocabulary) */
#define SIG_MAX_STATES 2048      /* configurations one stored walk may number */
#define PAIR_CAP 16384           /* pairs one check may visit */
#define PARTIAL_LIMIT 10000      /* continuation nodes before a partial reuse gives up (for a plain walk) */
#define PROBE_LIMIT 4000         /* nodes of the plain walk tried first (narrow configurations end within it) */
#define NS_NONE 0xFFFFu          /* node_state: no alive configuration at this node */
#define UNSET INT16_MIN          /* dense row: byte not read yet */
#define F_ESC 1
#define F_DEAD 2
#define H_CAP 8192               /* > 2 * SIG_MAX_STATES */
#define P_CAP 32768              /* > 2 * PAIR_CAP */

typedef struct {
    uint64_t last;               /* last use (0 = empty) */
    int32_t n_state;
    uint8_t *flag;               /* [n_state] F_ESC | F_DEAD */
    int32_t *dmax;               /* [n_state] the deepest alive node met in it, 0 none */
    uint32_t *dmask;             /* [n_state] bit d: met at an alive node of depth d (1 .. CV_SIG_DEPTH) */
    int32_t *rd_first;           /* [n_state + 1]: reads of k are rd_b / rd_to [rd_first[k] .. rd_first[k + 1]) */
    uint8_t *rd_b;
    int16_t *rd_to;              /* the number reached, -1 dead */
    uint16_t *rd_maxd;           /* the deepest parent depth it was read at; each k's reads sorted by it, deepest first */
    uint64_t *bits;              /* allowed tokens */
    int32_t *rng;                /* uncertain subtrees: triples (a, b, root depth), [a, b) into v->toks */
    int n_rng, cap_rng;
    uint16_t *node_state;        /* [n_node]: number | escaped << 15 at alive nodes of depth <= CV_SIG_DEPTH */
} sig_entry;

/* Stored walks made once per vocabulary (dsv4_cvocab_prepare_json) and only read afterwards, by every matcher. */
#define SHELF_MAX 4
struct sig_shelf {
    sig_entry e[SHELF_MAX];
    int n;
};

struct sig_store {
    sig_entry e[SIG_SLOTS];
    uint64_t clock;
    /* building: configuration -> number, dense rows, per-number scratch */
    int16_t *row;                /* [SIG_MAX_STATES * 256], allocated with the first stored walk */
    uint16_t *rowd;              /* [SIG_MAX_STATES * 256]: the deepest parent depth each byte was read at */
    int32_t *cfg_of;             /* [SIG_MAX_STATES] */
    uint8_t *flag;
    int32_t *dmax;
    uint32_t *dmask;
    uint32_t *hk, *hs, stamp;
    int32_t *hv;
    int32_t n_state;
    /* checking: the pairs found (stored number, configuration, distance), visited set, number -> configuration */
    int32_t *qk, *qc, *qd;
    uint64_t *pk;
    uint32_t *ps, pstamp;
    int32_t *fc;                 /* [SIG_MAX_STATES]: the configuration number k first paired with */
    uint32_t *fs;
    int fail_r[SHELF_MAX + SIG_SLOTS]; /* per stored walk (the vocabulary's, then own): the deepest agreement whose
                                  * partial reuse gave up (a deeper one is tried again; the next count of a
                                  * maxLength string agrees less, so it is not) */
    int16_t cls_to[256];         /* per pair: the number a byte class of the matcher was checked to reach */
    uint32_t cls_stamp[256], cstamp;
};

static int flags_of(const dsv4_cmatcher *m, int32_t c) {
    return (m->cfg_escape[c] ? F_ESC : 0) | (cfg_len(m, c) == 0 && !m->cfg_accept[c] ? F_DEAD : 0);
}

int sig_init(dsv4_cmatcher *m) {
    sig_store *S = calloc(1, sizeof *S);
    if (!S) return -1;
    m->sig = S;
    m->sig_probe = PROBE_LIMIT;
    S->cfg_of = malloc(sizeof *S->cfg_of * SIG_MAX_STATES);
    S->flag = malloc(SIG_MAX_STATES);
    S->dmax = malloc(sizeof *S->dmax * SIG_MAX_STATES);
    S->dmask = malloc(sizeof *S->dmask * SIG_MAX_STATES);
    S->hk = malloc(sizeof *S->hk * H_CAP);
    S->hs = calloc(H_CAP, sizeof *S->hs);
    S->hv = malloc(sizeof *S->hv * H_CAP);
    S->qk = malloc(sizeof *S->qk * PAIR_CAP);
    S->qc = malloc(sizeof *S->qc * PAIR_CAP);
    S->qd = malloc(sizeof *S->qd * PAIR_CAP);
    S->pk = malloc(sizeof *S->pk * P_CAP);
    S->ps = calloc(P_CAP, sizeof *S->ps);
    S->fc = malloc(sizeof *S->fc * SIG_MAX_STATES);
    S->fs = calloc(SIG_MAX_STATES, sizeof *S->fs);
    return S->cfg_of && S->flag && S->dmax && S->dmask && S->hk && S->hs && S->hv && S->qk && S->qc &&
           S->qd && S->pk && S->ps && S->fc && S->fs ? 0 : -1;
}

static void entry_clear(sig_entry *e) {
    free(e->flag); free(e->dmax); free(e->dmask); free(e->rd_first); free(e->rd_b); free(e->rd_to); free(e->rd_maxd);
    free(e->bits); free(e->rng); free(e->node_state);
    memset(e, 0, sizeof *e);
}

void sig_free(dsv4_cmatcher *m) {
    sig_store *S = m->sig;
    if (!S) return;
    for (int i = 0; i < SIG_SLOTS; i++) entry_clear(&S->e[i]);
    free(S->row); free(S->rowd); free(S->cfg_of); free(S->flag); free(S->dmax); free(S->dmask);
    free(S->hk); free(S->hs); free(S->hv);
    free(S->qk); free(S->qc); free(S->qd); free(S->pk); free(S->ps); free(S->fc); free(S->fs);
    free(S);
    m->sig = NULL;
}

size_t sig_bytes(const dsv4_cmatcher *m) {
    const sig_store *S = m->sig;
    if (!S) return 0;
    size_t b = sizeof *S + (S->row ? (size_t)SIG_MAX_STATES * 256 * 4 : 0) + (size_t)SIG_MAX_STATES * (4 * 4 + 1 + 8) + H_CAP * 12 +
               PAIR_CAP * 12 + P_CAP * 12;
    for (int i = 0; i < SIG_SLOTS; i++) {
        const sig_entry *e = &S->e[i];
        if (!e->last) continue;
        b += (size_t)e->n_state * 14 + (size_t)e->rd_first[e->n_state] * 5 + (size_t)m->words * sizeof(uint64_t) +
             (size_t)e->cap_rng * 3 * sizeof(int32_t) + (size_t)m->v->n_node * sizeof(uint16_t);
    }
    return b;
}

/* ---- the general walk --------------------------------------------------------------------------------------- */

int ci_add_range(dsv4_cmatcher *s, int slot, int32_t a, int32_t b) {
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

/* The walk (the matcher's own transitions) of trie nodes [i0, i1), a subtree or a run of sibling subtrees, whose
 * parent at depth depth[i0] - 1 has configuration c0 (escaped: e0), into the slot: allowed tokens into its bits,
 * uncertain subtrees into its ranges, *need raised. Gives up (1) past `limit` nodes; 0 done, -1 out of memory. */
static int walk_from(dsv4_cmatcher *s, int slot, int32_t i0, int32_t i1, int32_t c0, int e0, int64_t *need,
                     int64_t limit) {
    const dsv4_cvocab *v = s->v;
    uint64_t *bits = s->ci_bits + (size_t)slot * s->words;
    const uint16_t *depth = v->depth;
    const uint8_t *byte = v->byte;
    const int32_t *end = v->end, *tok_first = v->tok_first, *toks = v->toks;
    int64_t visited = 0, nmax = *need;
    int32_t *dfs = s->dfs;
    uint8_t *esc = s->esc;
    if (i0 >= i1) return 0;
    dfs[depth[i0] - 1] = c0;
    esc[depth[i0] - 1] = (uint8_t)e0;
    /* reloaded after step_byte, which may grow the tables */
    const int64_t *cmin = s->cfg_min;
    const int32_t *clen = s->cf.len;
    const uint8_t *cacc = s->cfg_accept, *cesc = s->cfg_escape;
    int rc = 0;
    for (int32_t i = i0; i < i1;) {
        if (visited >= limit) { rc = 1; break; }
        const int d = depth[i];
        const int32_t pc = dfs[d - 1];
        const int32_t *tr = s->cfg_trans[pc];
        int32_t c = tr ? tr[byte[i]] : T_UNKNOWN;
        if (c == T_UNKNOWN) {
            c = pda_step_byte(s, pc, byte[i]);
            cmin = s->cfg_min;
            clen = s->cf.len;
            cacc = s->cfg_accept;
            cesc = s->cfg_escape;
        }
        if (c == T_FAIL) return -1;
        visited++;
        const int e = esc[d - 1] || (c >= 0 && cesc[c]);
        if (c < 0 || (clen[c] == 0 && !cacc[c])) {
            /* dead inside the frames: the subtree is refused, or uncertain if a stack left them on the way */
            if (e && ci_add_range(s, slot, tok_first[i], tok_first[end[i]])) return -1;
            i = end[i];
            continue;
        }
        const int64_t nd = d + cmin[c];
        if (nd > nmax) nmax = nd;
        dfs[d] = c;
        esc[d] = (uint8_t)e;
        for (int32_t k = tok_first[i]; k < tok_first[i + 1]; k++) {
            const int32_t id = toks[k];
            bits[id >> 6] |= 1ULL << (id & 63);
        }
        i++;
    }
    s->st.trie_nodes_visited += visited;
    *need = nmax;
    return rc;
}

/* The plain walk of the whole trie from tc into the slot, giving up (1) past `limit` nodes. */
static int plain_fill(dsv4_cmatcher *m, int32_t tc, int slot, int64_t limit) {
    memset(m->ci_bits + (size_t)slot * m->words, 0, sizeof(uint64_t) * (size_t)m->words);
    m->ci_n_ranges[slot] = 0;
    m->ci_uncertain[slot] = 0;
    int64_t need = 0;
    const int rc = walk_from(m, slot, 1, m->v->n_node, tc, m->cfg_escape[tc], &need, limit);
    m->ci_need[slot] = need;
    return rc;
}

/* ---- stored walks --------------------------------------------------------------------------------------------- */

static uint32_t hmix(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return (uint32_t)x;
}

/* The number of configuration c in the walk being stored, numbered when new (its dense row unread): -1 when
 * there are too many. */
static int32_t number_of(dsv4_cmatcher *m, int32_t c) {
    sig_store *S = m->sig;
    uint32_t h = hmix((uint32_t)c) & (H_CAP - 1);
    for (; S->hs[h] == S->stamp; h = (h + 1) & (H_CAP - 1))
        if (S->hk[h] == (uint32_t)c) return S->hv[h];
    if (S->n_state >= SIG_MAX_STATES) return -1;
    const int32_t k = S->n_state++;
    S->hs[h] = S->stamp;
    S->hk[h] = (uint32_t)c;
    S->hv[h] = k;
    S->cfg_of[k] = c;
    S->flag[k] = (uint8_t)flags_of(m, c);
    S->dmax[k] = 0;
    S->dmask[k] = 0;
    int16_t *row = S->row + (size_t)k * 256;
    for (int b = 0; b < 256; b++) row[b] = UNSET;
    return k;
}

static int entry_range(sig_entry *e, int32_t a, int32_t b, int32_t d) {
    if (a >= b) return 0;
    const int n = e->n_rng;
    if (n > 0 && e->rng[3 * n - 2] == a && e->rng[3 * n - 1] == d) { e->rng[3 * n - 2] = b; return 0; }
    if (n == e->cap_rng) {
        const int cap = n ? 2 * n : 64;
        int32_t *r = realloc(e->rng, sizeof *r * 3 * (size_t)cap);
        if (!r) return -1;
        e->rng = r;
        e->cap_rng = cap;
    }
    e->rng[3 * n] = a;
    e->rng[3 * n + 1] = b;
    e->rng[3 * n + 2] = d;
    e->n_rng = n + 1;
    return 0;
}

/* Walk tc and store the walk in e. 0, 1 when it meets too many configurations (e left empty), -1 out of memory. */
static int entry_build(dsv4_cmatcher *m, sig_entry *e, int32_t tc) {
    sig_store *S = m->sig;
    const dsv4_cvocab *v = m->v;
    const size_t words = (size_t)m->words;
    if (!S->row && !(S->row = malloc(sizeof *S->row * (size_t)SIG_MAX_STATES * 256))) return -1;
    if (!S->rowd && !(S->rowd = malloc(sizeof *S->rowd * (size_t)SIG_MAX_STATES * 256))) return -1;
    if (!e->bits && !(e->bits = malloc(sizeof *e->bits * words))) return -1;
    if (!e->node_state && !(e->node_state = malloc(sizeof *e->node_state * (size_t)v->n_node))) return -1;
    e->n_rng = 0;
    e->last = 0;
    memset(e->bits, 0, sizeof *e->bits * words);
    memset(e->node_state, 0xff, sizeof *e->node_state * (size_t)v->n_node);
    if (++S->stamp == 0) { memset(S->hs, 0, sizeof *S->hs * H_CAP); S->stamp = 1; }
    S->n_state = 0;
    number_of(m, tc);
    const uint16_t *depth = v->depth;
    const uint8_t *byte = v->byte;
    const int32_t *end = v->end, *tok_first = v->tok_first, *toks = v->toks;
    int16_t *row = S->row;
    uint16_t *rowd = S->rowd;
    uint8_t *flag = S->flag;
    int32_t *dmax = S->dmax;
    uint32_t *dmask = S->dmask;
    uint64_t *bits = e->bits;
    uint16_t *ns = e->node_state;
    int32_t *stk = m->dfs;
    uint8_t *esc = m->esc;
    stk[0] = 0;
    esc[0] = flag[0] & F_ESC;
    int64_t visited = 0;
    if (!(flag[0] & F_DEAD))
        for (int32_t i = 1; i < v->n_node;) {
            const int d = depth[i];
            const size_t at = (size_t)stk[d - 1] * 256 + byte[i];
            int t = row[at];
            if (rowd[at] < d - 1 || t == UNSET) rowd[at] = (uint16_t)(d - 1);
            if (t == UNSET) {
                const int32_t c = pda_step_byte(m, S->cfg_of[stk[d - 1]], byte[i]);
                if (c == T_FAIL) return -1;
                if (c >= 0 && (t = number_of(m, c)) < 0) { m->st.trie_nodes_visited += visited; return 1; }
                if (c < 0) t = -1;
                row[at] = (int16_t)t;
            }
            visited++;
            const int x = esc[d - 1] | (t >= 0 && (flag[t] & F_ESC));
            if (t < 0 || (flag[t] & F_DEAD)) {
                if (x && entry_range(e, tok_first[i], tok_first[end[i]], d)) return -1;
                i = end[i];
                continue;
            }
            stk[d] = t;
            esc[d] = (uint8_t)x;
            /* stores only when something changes: the same configuration comes back node after node (a string's
             * characters), and a store on every node would chain them through memory */
            if (d > dmax[t]) dmax[t] = d;
            if (d <= CV_SIG_DEPTH) {
                if (!(dmask[t] >> d & 1)) dmask[t] |= 1u << d;
                ns[i] = (uint16_t)(t | x << 15);
            }
            for (int32_t k = tok_first[i]; k < tok_first[i + 1]; k++) {
                const int32_t id = toks[k];
                bits[id >> 6] |= 1ULL << (id & 63);
            }
            i++;
        }
    m->st.trie_nodes_visited += visited;
    /* the read set, by number */
    const int32_t n = S->n_state;
    int32_t n_read = 0;
    for (size_t at = 0; at < (size_t)n * 256; at++) n_read += row[at] != UNSET;
    free(e->flag); free(e->dmax); free(e->dmask); free(e->rd_first); free(e->rd_b); free(e->rd_to); free(e->rd_maxd);
    e->rd_maxd = malloc(sizeof *e->rd_maxd * (size_t)(n_read + 1));
    e->flag = malloc((size_t)n);
    e->dmax = malloc(sizeof *e->dmax * (size_t)n);
    e->dmask = malloc(sizeof *e->dmask * (size_t)n);
    e->rd_first = malloc(sizeof *e->rd_first * (size_t)(n + 1));
    e->rd_b = malloc((size_t)n_read + 1);
    e->rd_to = malloc(sizeof *e->rd_to * (size_t)(n_read + 1));
    if (!e->flag || !e->dmax || !e->dmask || !e->rd_first || !e->rd_b || !e->rd_to || !e->rd_maxd) return -1;
    memcpy(e->flag, S->flag, (size_t)n);
    memcpy(e->dmax, S->dmax, sizeof *e->dmax * (size_t)n);
    memcpy(e->dmask, S->dmask, sizeof *e->dmask * (size_t)n);
    int32_t *cnt = calloc((size_t)v->max_depth + 2, sizeof *cnt);   /* reads per depth, then where they go */
    if (!cnt) return -1;
    int32_t r = 0;
    for (int32_t k = 0; k < n; k++) {
        e->rd_first[k] = r;
        /* deepest first (a check stops at the first read shallower than its pair): a counting sort by depth */
        const int16_t *rk = row + (size_t)k * 256;
        const uint16_t *dk = rowd + (size_t)k * 256;
        int top = 0, nk = 0;
        for (int b = 0; b < 256; b++)
            if (rk[b] != UNSET) { cnt[dk[b]]++; nk++; if (dk[b] > top) top = dk[b]; }
        for (int d = top, at = r; d >= 0; d--) { const int c = cnt[d]; cnt[d] = at; at += c; }
        for (int b = 0; b < 256; b++)
            if (rk[b] != UNSET) {
                const int32_t j = cnt[dk[b]]++;
                e->rd_b[j] = (uint8_t)b;
                e->rd_to[j] = rk[b];
                e->rd_maxd[j] = dk[b];
            }
        for (int d = 0; d <= top; d++) cnt[d] = 0;
        r += nk;
    }
    free(cnt);
    e->rd_first[n] = r;
    e->n_state = n;
    e->last = ++S->clock;
    return 0;
}

/* Check tc against stored walk e (see the top): the distance of the first failure (INT_MAX: none within the
 * longest token), *func = the largest depth up to which every stored configuration found pairs with one
 * configuration of tc. -1 out of memory. The pairs found stay in S->qk/qc/qd (S->fc: k -> its first partner). */
static int check(dsv4_cmatcher *m, const sig_entry *e, int32_t tc, int *func, int32_t *n_pairs) {
    sig_store *S = m->sig;
    *func = INT_MAX;
    *n_pairs = 0;
    if (flags_of(m, tc) != e->flag[0]) return 0;
    if (++S->pstamp == 0) {
        memset(S->ps, 0, sizeof *S->ps * P_CAP);
        memset(S->fs, 0, sizeof *S->fs * SIG_MAX_STATES);
        S->pstamp = 1;
    }
    const int max_depth = m->v->max_depth;
    int32_t n = 0;
    S->qk[n] = 0; S->qc[n] = tc; S->qd[n] = 0; n++;
    S->fs[0] = S->pstamp;
    S->fc[0] = tc;
    int r = INT_MAX;
    for (int32_t qi = 0; qi < n && r == INT_MAX; qi++) {
        const int32_t k = S->qk[qi], c = S->qc[qi], d = S->qd[qi];
        if (d >= max_depth) break;   /* no token reaches a node below this one */
        int32_t last_k2 = -1, last_t = -1;
        if (++S->cstamp == 0) { memset(S->cls_stamp, 0, sizeof S->cls_stamp); S->cstamp = 1; }
        /* the pair meets at nodes of depth >= d only: reads made only above that depth do not apply */
        for (int32_t j = e->rd_first[k]; j < e->rd_first[k + 1] && e->rd_maxd[j] >= d; j++) {
            const int32_t k2 = e->rd_to[j];
            /* bytes of one class of this matcher go where its first byte goes: one check per (class, k2) */
            const uint8_t cls = m->byte_rep[e->rd_b[j]];
            if (S->cls_stamp[cls] == S->cstamp && S->cls_to[cls] == k2) continue;
            S->cls_stamp[cls] = S->cstamp;
            S->cls_to[cls] = (int16_t)k2;
            const int32_t *tr = m->cfg_trans[c];
            int32_t t = tr ? tr[e->rd_b[j]] : T_UNKNOWN;
            if (t == T_UNKNOWN) t = pda_step_byte(m, c, e->rd_b[j]);
            if (t == T_FAIL) return -1;
            if (k2 < 0) {
                if (t >= 0) { r = d; break; }
                continue;
            }
            if (t < 0 || flags_of(m, t) != e->flag[k2]) { r = d; break; }
            if (e->flag[k2] & F_DEAD) continue;   /* a walk does not go past it */
            if (k2 == last_k2 && t == last_t) continue;
            last_k2 = k2;
            last_t = t;
            const uint64_t key = (uint64_t)(uint32_t)k2 << 32 | (uint32_t)t;
            uint32_t h = hmix(key) & (P_CAP - 1);
            int seen = 0;
            for (; S->ps[h] == S->pstamp; h = (h + 1) & (P_CAP - 1))
                if (S->pk[h] == key) { seen = 1; break; }
            if (seen) continue;
            if (n == PAIR_CAP) { r = d; break; }   /* too many: trust only what was checked */
            S->ps[h] = S->pstamp;
            S->pk[h] = key;
            if (S->fs[k2] != S->pstamp) { S->fs[k2] = S->pstamp; S->fc[k2] = t; }
            else if (S->fc[k2] != t && d < *func) *func = d;   /* two partners at depth d + 1 */
            S->qk[n] = k2; S->qc[n] = t; S->qd[n] = d + 1; n++;
        }
    }
    *n_pairs = n;
    return r >= max_depth ? INT_MAX : r;
}

/* Fill the slot from e (checked against tc: S holds the pairs) for tokens of at most r bytes (INT_MAX: all),
 * then walk the deeper nodes from tc's configurations at depth r. 0 done, 1 gave up past `limit` continuation
 * nodes, -1 out of memory. */
static int entry_apply(dsv4_cmatcher *m, const sig_entry *e, int r, int32_t n_pairs, int slot, int64_t limit) {
    sig_store *S = m->sig;
    const dsv4_cvocab *v = m->v;
    const size_t words = (size_t)m->words;
    uint64_t *bits = m->ci_bits + (size_t)slot * words;
    m->ci_n_ranges[slot] = 0;
    m->ci_uncertain[slot] = 0;
    const int whole = r == INT_MAX;
    if (whole) memcpy(bits, e->bits, sizeof *bits * words);
    else {
        const uint64_t *le = v->len_le + (size_t)r * words;
        for (size_t w = 0; w < words; w++) bits[w] = e->bits[w] & le[w];
    }
    for (int k = 0; k < e->n_rng; k++)
        if ((whole || e->rng[3 * k + 2] <= r) && ci_add_range(m, slot, e->rng[3 * k], e->rng[3 * k + 1])) return -1;
    /* need: over the pairs, the deepest alive node of the stored configuration (within r) + the minimum of
     * tc's; an upper bound of the walk's own */
    int64_t need = 0;
    const uint32_t within = whole ? 0 : (uint32_t)((2ULL << r) - 1);
    for (int32_t q = 0; q < n_pairs; q++) {
        const int32_t k = S->qk[q];
        int dk = e->dmax[k];
        if (!whole) {
            const uint32_t mk = e->dmask[k] & within;
            dk = mk ? 31 - __builtin_clz(mk) : 0;
        }
        if (dk > 0 && dk + m->cfg_min[S->qc[q]] > need) need = dk + m->cfg_min[S->qc[q]];
    }
    if (!whole) {
        const int32_t *end = v->end;
        int64_t budget = limit;
        for (int32_t q = v->depth_first[r]; q < v->depth_first[r + 1]; q++) {
            const int32_t p = v->depth_nodes[q];
            const uint16_t x = e->node_state[p];
            if (x == NS_NONE || end[p] == p + 1) continue;
            const int64_t before = m->st.trie_nodes_visited;
            const int rc = walk_from(m, slot, p + 1, end[p], S->fc[x & 0x7fff], x >> 15, &need, budget);
            if (rc) return rc;
            budget -= m->st.trie_nodes_visited - before;
        }
    }
    m->ci_need[slot] = need;
    return 0;
}

int ci_fill(dsv4_cmatcher *m, int32_t tc, int32_t c, int slot, int32_t *key) {
    sig_store *S = m->sig;
    m->st.mask_walks++;
    /* the stored walk that serves tc for the longest tokens (a check that fails does so within the first bytes):
     * the vocabulary's (read-only), then the matcher's own */
    const struct sig_shelf *shelf = m->v->shelf;
    const int n_shelf = shelf ? shelf->n : 0;
    sig_entry *best = NULL;
    int best_r = 0, best_i = -1, near_bound = 0, rc;
    for (int i = 0; i < n_shelf + SIG_SLOTS; i++) {
        sig_entry *e = i < n_shelf ? (sig_entry *)&shelf->e[i] : &S->e[i - n_shelf];
        if (!e->last) continue;
        int func;
        int32_t n_pairs;
        int r = check(m, e, tc, &func, &n_pairs);
        if (r < 0) return -1;
        if (r == INT_MAX) {
            if (entry_apply(m, e, r, n_pairs, slot, INT64_MAX)) return -1;
            if (i >= n_shelf) e->last = ++S->clock;
            m->st.shared_walks++;
            return 0;
        }
        /* tc parts from a stored walk a few bytes down (a string a few characters before its maxLength): its
         * own stored walk would only serve the next counts that far, not worth storing */
        if (r >= 2 && r < CV_SIG_DEPTH) near_bound = 1;
        /* a partial answer needs tc's configuration at the depth-r nodes: one partner per number */
        if (func < r) r = func;
        if (r > CV_SIG_DEPTH) r = CV_SIG_DEPTH;
        if (r > best_r) { best = e; best_r = r; best_i = i; }
    }
    /* narrow configurations (few tokens alive: after '{', in a number) walk a few nodes: nothing to share */
    if ((rc = plain_fill(m, tc, slot, m->sig_probe)) <= 0) return rc;
    /* a wide counted repetition: the table of its x, made once, serves every count (constraint_count.c) */
    if ((rc = count_fill(m, tc, slot, 1))) return rc < 0 ? -1 : 0;
    if (tc != c && (rc = count_fill(m, c, slot, 1))) {
        *key = c;
        return rc < 0 ? -1 : 0;
    }
    if ((rc = count_fill_after_byte(m, c, slot))) {
        *key = c;
        return rc < 0 ? -1 : 0;
    }
    /* a configuration that agrees with a stored walk no deeper than one whose partial reuse gave up (the next
     * counts of a short maxLength string) is walked plainly: it would give up too, and its own stored walk
     * would serve nothing else */
    if (best && best_r <= S->fail_r[best_i]) return plain_fill(m, tc, slot, INT64_MAX) ? -1 : 0;
    if (best) {
        int func;
        int32_t n_pairs;
        if (check(m, best, tc, &func, &n_pairs) < 0) return -1;   /* its pairs again, into S */
        rc = entry_apply(m, best, best_r, n_pairs, slot, PARTIAL_LIMIT);
        if (rc < 0) return -1;
        if (rc == 0) {
            if (best >= S->e && best < S->e + SIG_SLOTS) best->last = ++S->clock;
            m->st.shared_walks++;
            m->st.shared_partial++;
            return 0;
        }
        /* a stored walk agrees with tc for short tokens but tc is alive deep below where they part (a string a
         * few UTF-8 characters before its maxLength): its own walk would serve nothing else, so it is not
         * stored (storing costs ~15 % more than the plain walk) */
        S->fail_r[best_i] = best_r;
        return plain_fill(m, tc, slot, INT64_MAX) ? -1 : 0;
    }
    if (near_bound) return plain_fill(m, tc, slot, INT64_MAX) ? -1 : 0;
    /* a walk of its own, stored in the least recently used slot */
    int k = 0;
    for (int i = 1; i < SIG_SLOTS; i++)
        if (S->e[i].last < S->e[k].last) k = i;
    S->fail_r[n_shelf + k] = 0;
    rc = entry_build(m, &S->e[k], tc);
    if (rc < 0) { entry_clear(&S->e[k]); return -1; }
    if (rc > 0) return plain_fill(m, tc, slot, INT64_MAX) ? -1 : 0;
    /* tc against its own walk: each number pairs with the configuration it numbers */
    for (int32_t q = 0; q < S->n_state; q++) { S->qk[q] = q; S->qc[q] = S->cfg_of[q]; }
    return entry_apply(m, &S->e[k], INT_MAX, S->n_state, slot, INT64_MAX) ? -1 : 0;
}

/* ---- walks made once per vocabulary ------------------------------------------------------------------------ */

void sig_shelf_free(struct sig_shelf *sh) {
    if (!sh) return;
    for (int i = 0; i < sh->n; i++) entry_clear(&sh->e[i]);
    free(sh);
}

/* The walk of a JSON string's characters, as a schema's string value truncates to it: the item of an array of
 * strings (its closing quote leaves the truncated frames, as a property's value does). */
static int shelve_string(dsv4_cvocab *v, int lt_escaped, dsv4_error *err) {
    static const char schema[] = "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}";
    const dsv4_schema_opts o = { 0, lt_escaped };
    dsv4_grammar *g = NULL;
    dsv4_cmatcher *m = NULL;
    int rc = dsv4_grammar_from_schema_text(schema, sizeof schema - 1, &o, &g, err);
    if (!rc) rc = dsv4_cmatcher_new(g, v, &m, err);
    if (!rc) {
        int32_t c = pda_step_byte(m, m->start, '[');
        if (c >= 0) c = pda_step_byte(m, c, '"');
        int64_t ccut;
        const int32_t tc = c >= 0 ? pda_truncate(m, c, &ccut) : c;
        sig_entry *e = &v->shelf->e[v->shelf->n];
        const int built = tc >= 0 ? entry_build(m, e, tc) : -1;
        if (built == 0) v->shelf->n++;
        else {
            entry_clear(e);   /* too many configurations (1): no stored walk, masks are walked as before */
            if (built < 0) rc = dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory (the vocabulary's string walks)");
        }
    }
    dsv4_cmatcher_free(m);
    dsv4_grammar_free(g);
    return rc;
}

int dsv4_cvocab_prepare_json(dsv4_cvocab *v, dsv4_error *err) {
    if (v->shelf) return 0;
    if (!(v->shelf = calloc(1, sizeof *v->shelf))) return dsv4_fail(err, DSV4_E_NOMEM, "constraint: out of memory");
    for (int lt = 0; lt < 2; lt++) {
        const int rc = shelve_string(v, lt, err);
        if (rc) return rc;
    }
    return count_prepare_json(v, err);
}
