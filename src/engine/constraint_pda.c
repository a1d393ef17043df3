/* The matcher's automaton: interned stack nodes and parent sets, the closure that merges stacks with the same
 * top (constraint_pda.h says why), configurations, byte transitions, and truncation of a configuration's
 * shared context. */
#include "engine/constraint_pda.h"
#include <stdlib.h>
#include <string.h>

#define PA_NOMEM INT32_MIN       /* parent code: out of memory */
#define FRAME(x) (PA_SET0 - (x)) /* closure reference: the frame above item x (see closure) */
#define IS_FRAME(r) ((r) <= PA_SET0)
#define FRAME_POS(r) (PA_SET0 - (r))

enum { F_WORK = 1, F_PRED = 2, F_RET = 4, F_READY = 8, F_RESOLVING = 16 };

int ivec_push(ivec *a, int32_t x) {
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

static uint32_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Sort and drop duplicates. */
static void sort_unique(ivec *a) {
    if (a->n > 1) qsort(a->v, (size_t)a->n, sizeof *a->v, cmp_i32);
    int64_t u = 0;
    for (int64_t i = 0; i < a->n; i++)
        if (!u || a->v[i] != a->v[u - 1]) a->v[u++] = a->v[i];
    a->n = u;
}

/* ---- interned lists (parent sets, configurations) ---------------------------------------------------------- */

static uint32_t list_hash(const int32_t *v, int64_t n, int tag) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)tag;
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint32_t)v[i]) * 0x100000001b3ULL;
    return mix(h);
}

static int lists_rehash(ilists *L) {
    const uint32_t cap = L->h_cap ? 2 * L->h_cap : 1024;
    int32_t *t = malloc(sizeof *t * cap);
    if (!t) return -1;
    memset(t, 0xff, sizeof *t * cap);
    for (int32_t k = 0; k < L->n; k++) {
        uint32_t h = list_hash(L->v.v + L->off[k], L->len[k], L->tag[k]) & (cap - 1);
        while (t[h] >= 0) h = (h + 1) & (cap - 1);
        t[h] = k;
    }
    free(L->h);
    L->h = t;
    L->h_cap = cap;
    return 0;
}

/* The id of list v[0..n) with tag, or -1 with *slot = where to add it; -2 when out of memory. */
static int32_t lists_find(ilists *L, const int32_t *v, int64_t n, int tag, uint32_t *slot) {
    if ((uint32_t)(L->n + 1) * 2 > L->h_cap && lists_rehash(L)) return -2;
    uint32_t h = list_hash(v, n, tag) & (L->h_cap - 1);
    for (int32_t k; (k = L->h[h]) >= 0; h = (h + 1) & (L->h_cap - 1))
        if (L->len[k] == n && L->tag[k] == tag && (n == 0 || !memcmp(L->v.v + L->off[k], v, sizeof *v * (size_t)n)))
            return k;
    *slot = h;
    return -1;
}

/* Room for one more list (the caller grows its own per-list arrays to L->cap after a 1). Returns 0 (room
 * already), 1 (grown) or -1. */
static int lists_reserve(ilists *L) {
    if (L->n < L->cap) return 0;
    if (L->cap >= MAX_CONFIGS) return -1;
    const int32_t c = L->cap ? 2 * L->cap : 256;
    int64_t *off = realloc(L->off, sizeof *off * (size_t)c);
    if (off) L->off = off;
    int32_t *len = realloc(L->len, sizeof *len * (size_t)c);
    if (len) L->len = len;
    uint8_t *tag = realloc(L->tag, (size_t)c);
    if (tag) L->tag = tag;
    if (!off || !len || !tag) return -1;
    L->cap = c;
    return 1;
}

static int32_t lists_add(ilists *L, const int32_t *v, int64_t n, int tag, uint32_t slot) {
    const int64_t off = L->v.n;
    for (int64_t i = 0; i < n; i++)
        if (ivec_push(&L->v, v[i])) return -1;
    const int32_t k = L->n++;
    L->off[k] = off;
    L->len[k] = (int32_t)n;
    L->tag[k] = (uint8_t)tag;
    L->h[slot] = k;
    return k;
}

static void lists_free(ilists *L) { free(L->v.v); free(L->off); free(L->len); free(L->tag); free(L->h); }

static size_t lists_bytes(const ilists *L) {
    return (size_t)L->v.cap * sizeof(int32_t) + (size_t)L->cap * (sizeof(int64_t) + sizeof(int32_t) + 1) +
           (size_t)L->h_cap * sizeof(int32_t);
}

/* ---- parent codes ----------------------------------------------------------------------------------------- */

static int64_t parent_min(const dsv4_cmatcher *m, int32_t p) {
    if (p >= 0) return m->node_min[p];
    if (p > PA_SET0) return 0;
    return m->ps_min[PA_SET0 - p];
}

/* The frames a parent code stands for: a pointer to *n ids (one = scratch for a single one). The pointer is
 * into the parent-set table: valid until the next parent set is interned. */
static const int32_t *members(const dsv4_cmatcher *m, int32_t p, int32_t *one, int32_t *n) {
    if (p > PA_SET0) { *one = p; *n = 1; return one; }
    const int32_t k = PA_SET0 - p;
    *n = m->ps.len[k];
    return m->ps.v.v + m->ps.off[k];
}

/* The parent code of the frames in m->tmp (sorted here; at least one): the frame itself when there is one. */
static int32_t parent_of(dsv4_cmatcher *m) {
    sort_unique(&m->tmp);
    if (m->tmp.n == 1) return m->tmp.v[0];
    uint32_t slot;
    int32_t k = lists_find(&m->ps, m->tmp.v, m->tmp.n, 0, &slot);
    if (k == -2) return PA_NOMEM;
    if (k < 0) {
        const int r = lists_reserve(&m->ps);
        if (r < 0) return PA_NOMEM;
        if (r > 0) {
            int64_t *mn = realloc(m->ps_min, sizeof *mn * (size_t)m->ps.cap);
            if (!mn) return PA_NOMEM;
            m->ps_min = mn;
        }
        if ((k = lists_add(&m->ps, m->tmp.v, m->tmp.n, 0, slot)) < 0) return PA_NOMEM;
        int64_t mn = INT64_MAX;
        for (int64_t i = 0; i < m->tmp.n; i++) {
            const int64_t x = parent_min(m, m->tmp.v[i]);
            if (x < mn) mn = x;
        }
        m->ps_min[k] = mn;
    }
    return PA_SET0 - k;
}

/* ---- stack nodes ------------------------------------------------------------------------------------------ */

static int node_rehash(dsv4_cmatcher *m) {
    const uint32_t cap = m->nh_cap ? 2 * m->nh_cap : 1024;
    int32_t *t = malloc(sizeof *t * cap);
    if (!t) return -1;
    memset(t, 0xff, sizeof *t * cap);
    for (int32_t i = 0; i < m->n_node; i++) {
        uint32_t h = mix(((uint64_t)(uint32_t)m->node[i].pos << 32) | (uint32_t)m->node[i].parent) & (cap - 1);
        while (t[h] >= 0) h = (h + 1) & (cap - 1);
        t[h] = i;
    }
    free(m->nh);
    m->nh = t;
    m->nh_cap = cap;
    return 0;
}

/* The node (pos, parent code), created when new; -1 when out of memory. */
static int32_t node_get(dsv4_cmatcher *m, int32_t pos, int32_t parent) {
    if (parent == PA_NOMEM) return -1;
    if ((uint32_t)(m->n_node + 1) * 2 > m->nh_cap && node_rehash(m)) return -1;
    uint32_t h = mix(((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent) & (m->nh_cap - 1);
    for (int32_t id; (id = m->nh[h]) >= 0; h = (h + 1) & (m->nh_cap - 1))
        if (m->node[id].pos == pos && m->node[id].parent == parent) return id;
    if (m->n_node == m->cap_node) {
        if (m->cap_node >= MAX_CONFIGS * 4) return -1;
        const int32_t c = m->cap_node ? 2 * m->cap_node : 1024;
        cnode *a = realloc(m->node, sizeof *a * (size_t)c);
        if (a) m->node = a;
        int64_t *b = realloc(m->node_min, sizeof *b * (size_t)c);
        if (b) m->node_min = b;
        uint32_t *d = realloc(m->node_seen, sizeof *d * (size_t)c);
        if (d) m->node_seen = d;
        int32_t *e = realloc(m->node_map, sizeof *e * (size_t)c);
        if (e) m->node_map = e;
        if (!a || !b || !d || !e) return -1;
        m->cap_node = c;
    }
    const int32_t id = m->n_node++;
    m->node[id] = (cnode){ pos, parent };
    m->node_min[id] = m->g->minrest[pos] + parent_min(m, parent);
    m->node_seen[id] = 0;
    m->nh[h] = id;
    m->st.stack_nodes = m->n_node;
    return id;
}

/* ---- configurations --------------------------------------------------------------------------------------- */

/* Intern the configuration (ready nodes in m->acc, accept, escape); its id or T_FAIL. */
static int32_t cfg_get(dsv4_cmatcher *m, int accept, int escape) {
    sort_unique(&m->acc);
    const int tag = accept | escape << 1;
    uint32_t slot;
    const int32_t found = lists_find(&m->cf, m->acc.v, m->acc.n, tag, &slot);
    if (found >= 0) return found;
    if (found == -2) return T_FAIL;
    const int r = lists_reserve(&m->cf);
    if (r < 0) return T_FAIL;
    if (r > 0) {
        const size_t c = (size_t)m->cf.cap;
        uint8_t *acc = realloc(m->cfg_accept, c);
        if (acc) m->cfg_accept = acc;
        uint8_t *esc = realloc(m->cfg_escape, c);
        if (esc) m->cfg_escape = esc;
        int32_t *ci = realloc(m->cfg_ci, sizeof *ci * c);
        if (ci) m->cfg_ci = ci;
        int64_t *mn = realloc(m->cfg_min, sizeof *mn * c);
        if (mn) m->cfg_min = mn;
        int32_t **tr = realloc(m->cfg_trans, sizeof *tr * c);
        if (tr) m->cfg_trans = tr;
        int32_t **str = realloc(m->cfg_strans, sizeof *str * c);
        if (str) m->cfg_strans = str;
        int32_t *sl = realloc(m->cfg_slot, sizeof *sl * c);
        if (sl) m->cfg_slot = sl;
        if (!acc || !esc || !ci || !mn || !tr || !str || !sl) return T_FAIL;
    }
    const int32_t c = lists_add(&m->cf, m->acc.v, m->acc.n, tag, slot);
    if (c < 0) return T_FAIL;
    int64_t mn = accept ? 0 : INT64_MAX;
    for (int64_t i = 0; i < m->acc.n; i++)
        if (m->node_min[m->acc.v[i]] < mn) mn = m->node_min[m->acc.v[i]];
    m->cfg_accept[c] = (uint8_t)accept;
    m->cfg_escape[c] = (uint8_t)escape;
    m->cfg_ci[c] = -1;
    m->cfg_min[c] = mn;
    m->cfg_trans[c] = NULL;
    m->cfg_strans[c] = NULL;
    m->cfg_slot[c] = -1;
    m->st.configs = m->cf.n;
    return c;
}

/* ---- closure ---------------------------------------------------------------------------------------------- *
 *
 * One closure computes the configuration reached by one step, the way an Earley parser computes a set: every
 * grammar position active in this step is one item, whatever the stacks that lead to it, with the set of its
 * references (the frames below it). A reference is an interned node (a frame of an earlier step), PA_BOTTOM,
 * PA_WILD, or FRAME(x): "position x + 1 above the references of item x", the frame that item x (a rule
 * reference not in tail position) pushes for the rule it calls. Items only gain references, so propagation
 * works on the new ones only:
 *   a byte set:           the item is ready (it goes into the configuration);
 *   a rule reference r:   in tail position, r's alternatives get the item's references; otherwise they get
 *                         FRAME(item) once, and if r has already finished in this step (it returned to the
 *                         frame: a nullable rule), position item + 1 gets the item's references too;
 *   the end of an alternative: each reference is returned to: PA_BOTTOM = the output may end here (accept),
 *                         PA_WILD = escape, a node = its position becomes an item with the node's parents as
 *                         references, FRAME(x) = position x + 1 gets x's references (now and later).
 * Then frames are interned bottom-up (no left recursion, so FRAME references have no cycle) and each ready item
 * becomes one node whose parent is the set of its references. */

static void gen_next(dsv4_cmatcher *m) {
    if (++m->gen == 0) {   /* wrapped: forget every stamp */
        memset(m->it_gen, 0, sizeof *m->it_gen * (size_t)m->g->n_el);
        if (m->dg) memset(m->dg, 0, sizeof *m->dg * m->d_cap);
        m->gen = 1;
    }
    m->d_n = 0;
    m->rv.n = m->rn.n = m->work.n = m->ready.n = 0;
}

static uint32_t pair_hash(int32_t pos, int32_t ref) { return mix(((uint64_t)(uint32_t)pos << 32) | (uint32_t)ref); }

/* 1 when (pos, ref) was already added in this closure, else records it; -1 out of memory. */
static int pair_seen(dsv4_cmatcher *m, int32_t pos, int32_t ref) {
    if ((m->d_n + 1) * 2 > m->d_cap) {
        const uint32_t cap = m->d_cap ? 2 * m->d_cap : 1024;
        uint64_t *k = malloc(sizeof *k * cap);
        uint32_t *g = calloc(cap, sizeof *g);
        if (!k || !g) { free(k); free(g); return -1; }
        for (uint32_t i = 0; i < m->d_cap; i++)
            if (m->dg[i] == m->gen) {
                uint32_t h = pair_hash((int32_t)(m->dk[i] >> 32), (int32_t)(uint32_t)m->dk[i]) & (cap - 1);
                while (g[h] == m->gen) h = (h + 1) & (cap - 1);
                g[h] = m->gen;
                k[h] = m->dk[i];
            }
        free(m->dk);
        free(m->dg);
        m->dk = k;
        m->dg = g;
        m->d_cap = cap;
    }
    const uint64_t key = ((uint64_t)(uint32_t)pos << 32) | (uint32_t)ref;
    uint32_t h = pair_hash(pos, ref) & (m->d_cap - 1);
    for (; m->dg[h] == m->gen; h = (h + 1) & (m->d_cap - 1))
        if (m->dk[h] == key) return 1;
    m->dg[h] = m->gen;
    m->dk[h] = key;
    m->d_n++;
    m->st.closure_refs++;
    return 0;
}

/* Give item pos the reference ref (nothing when it has it already). 0, or -1 when out of memory. */
static int add_ref(dsv4_cmatcher *m, int32_t pos, int32_t ref) {
    if (m->it_gen[pos] != m->gen) {
        m->it_gen[pos] = m->gen;
        m->it_head[pos] = m->it_tail[pos] = m->it_done[pos] = -1;
        m->it_flag[pos] = 0;
        m->it_node[pos] = -1;
    }
    const int seen = pair_seen(m, pos, ref);
    if (seen) return seen > 0 ? 0 : -1;
    const int32_t r = (int32_t)m->rv.n;
    if (ivec_push(&m->rv, ref) || ivec_push(&m->rn, -1)) return -1;
    if (m->it_tail[pos] >= 0) m->rn.v[m->it_tail[pos]] = r;
    else m->it_head[pos] = r;
    m->it_tail[pos] = r;
    if (!(m->it_flag[pos] & F_WORK)) {
        m->it_flag[pos] |= F_WORK;
        if (ivec_push(&m->work, pos)) return -1;
    }
    return 0;
}

/* Give item pos every frame of parent code p. */
static int add_parent(dsv4_cmatcher *m, int32_t pos, int32_t p) {
    int32_t one, n;
    const int32_t *f = members(m, p, &one, &n);
    for (int32_t i = 0; i < n; i++)
        if (add_ref(m, pos, f[i])) return -1;
    return 0;
}

/* Give item to every reference item from has now. */
static int add_refs_of(dsv4_cmatcher *m, int32_t to, int32_t from) {
    for (int32_t r = m->it_head[from]; r >= 0; r = m->rn.v[r])
        if (add_ref(m, to, m->rv.v[r])) return -1;
    return 0;
}

/* Return to reference ref from the end of an alternative. */
static int return_to(dsv4_cmatcher *m, int32_t ref, int *accept, int *escape) {
    if (ref == PA_BOTTOM) { *accept = 1; return 0; }
    if (ref == PA_WILD) { *escape = 1; return 0; }
    if (ref >= 0) return add_parent(m, m->node[ref].pos, m->node[ref].parent);
    const int32_t x = FRAME_POS(ref);
    if (m->it_flag[x] & F_RET) return 0;
    m->it_flag[x] |= F_RET;
    return add_refs_of(m, x + 1, x);
}

static int closure(dsv4_cmatcher *m, int *accept, int *escape) {
    const dsv4_grammar *g = m->g;
    while (m->work.n > 0) {
        const int32_t pos = m->work.v[--m->work.n];
        m->it_flag[pos] &= (uint8_t)~F_WORK;
        const gelem e = g->el[pos];
        if (e.kind == GE_BYTES || e.kind == GE_TOKEN) {
            if (!(m->it_flag[pos] & F_READY)) {
                m->it_flag[pos] |= F_READY;
                if (ivec_push(&m->ready, pos)) return -1;
            }
            m->it_done[pos] = m->it_tail[pos];
            continue;
        }
        const int tail = e.kind == GE_RULE && g->el[pos + 1].kind == GE_END;
        if (e.kind == GE_RULE && !tail && !(m->it_flag[pos] & F_PRED)) {
            m->it_flag[pos] |= F_PRED;
            for (int32_t a = g->alt_first[e.arg]; a < g->alt_first[e.arg + 1]; a++)
                if (add_ref(m, g->alt_pos[a], FRAME(pos))) return -1;
        }
        for (;;) {
            const int32_t r = m->it_done[pos] < 0 ? m->it_head[pos] : m->rn.v[m->it_done[pos]];
            if (r < 0) break;
            m->it_done[pos] = r;
            const int32_t ref = m->rv.v[r];
            if (e.kind == GE_END) {
                if (return_to(m, ref, accept, escape)) return -1;
            } else if (tail) {
                for (int32_t a = g->alt_first[e.arg]; a < g->alt_first[e.arg + 1]; a++)
                    if (add_ref(m, g->alt_pos[a], ref)) return -1;
            } else if (m->it_flag[pos] & F_RET) {
                if (add_ref(m, pos + 1, ref)) return -1;
            }
        }
    }
    return 0;
}

/* The parent code of item x's references, its frames interned first (depth first, on m->work). */
static int32_t refs_parent(dsv4_cmatcher *m, int32_t x0) {
    m->work.n = 0;
    for (int32_t r = m->it_head[x0]; r >= 0; r = m->rn.v[r])
        if (IS_FRAME(m->rv.v[r]) && m->it_node[FRAME_POS(m->rv.v[r])] < 0 && ivec_push(&m->work, FRAME_POS(m->rv.v[r])))
            return PA_NOMEM;
    while (m->work.n > 0) {
        const int32_t x = m->work.v[m->work.n - 1];
        if (m->it_node[x] >= 0) { m->work.n--; continue; }
        m->it_flag[x] |= F_RESOLVING;
        int pending = 0;
        for (int32_t r = m->it_head[x]; r >= 0; r = m->rn.v[r]) {
            const int32_t ref = m->rv.v[r];
            if (!IS_FRAME(ref) || m->it_node[FRAME_POS(ref)] >= 0) continue;
            if (m->it_flag[FRAME_POS(ref)] & F_RESOLVING) return PA_NOMEM; /* a cycle: left recursion, which gb_finish refuses */
            if (ivec_push(&m->work, FRAME_POS(ref))) return PA_NOMEM;
            pending = 1;
        }
        if (pending) continue;
        m->tmp.n = 0;
        for (int32_t r = m->it_head[x]; r >= 0; r = m->rn.v[r]) {
            const int32_t ref = m->rv.v[r];
            if (ivec_push(&m->tmp, IS_FRAME(ref) ? m->it_node[FRAME_POS(ref)] : ref)) return PA_NOMEM;
        }
        const int32_t id = node_get(m, x + 1, parent_of(m));
        if (id < 0) return PA_NOMEM;
        m->it_node[x] = id;
        m->work.n--;
    }
    m->tmp.n = 0;
    for (int32_t r = m->it_head[x0]; r >= 0; r = m->rn.v[r]) {
        const int32_t ref = m->rv.v[r];
        if (ivec_push(&m->tmp, IS_FRAME(ref) ? m->it_node[FRAME_POS(ref)] : ref)) return PA_NOMEM;
    }
    return parent_of(m);
}

/* Close the items added since gen_next and intern the configuration: its id, -1 when dead (nothing ready, no
 * end, no escape) and dead_ok, T_FAIL out of memory. */
static int32_t close_step(dsv4_cmatcher *m, int dead_ok) {
    int accept = 0, escape = 0;
    if (closure(m, &accept, &escape)) return T_FAIL;
    m->acc.n = 0;
    for (int64_t i = 0; i < m->ready.n; i++) {
        const int32_t pos = m->ready.v[i];
        const int32_t id = node_get(m, pos, refs_parent(m, pos));
        if (id < 0 || ivec_push(&m->acc, id)) return T_FAIL;
    }
    if (dead_ok && m->acc.n == 0 && !accept && !escape) return -1;
    return cfg_get(m, accept, escape);
}

int32_t pda_step_byte(dsv4_cmatcher *m, int32_t c, unsigned b) {
    int32_t *tr = m->cfg_trans[c];
    if (!tr) {
        if (!(tr = malloc(sizeof *tr * 256))) return T_FAIL;
        for (int i = 0; i < 256; i++) tr[i] = T_UNKNOWN;
        m->cfg_trans[c] = tr;
        m->n_trans_tables++;
    }
    if (tr[b] != T_UNKNOWN) return tr[b];
    if (m->byte_rep[b] != b) {
        /* b does what its class's first byte does in every configuration: share that transition */
        const int32_t next = pda_step_byte(m, c, m->byte_rep[b]);
        if (next != T_FAIL) tr[b] = next;
        return next;
    }
    m->st.transitions++;
    const dsv4_grammar *g = m->g;
    gen_next(m);
    const int32_t len = cfg_len(m, c);
    for (int32_t i = 0; i < len; i++) {
        const cnode n = m->node[cfg_items(m, c)[i]];
        const gelem e = g->el[n.pos];
        if (e.kind == GE_BYTES && gb_set_has(&g->sets[e.arg], b) && add_parent(m, n.pos + 1, n.parent)) return T_FAIL;
    }
    const int32_t next = close_step(m, 1);
    if (next == T_FAIL) return T_FAIL;
    m->cfg_trans[c][b] = next; /* cfg_trans may have moved; the table itself did not */
    return next;
}

/* The configuration of entering grammar positions with the frames of parent code `parent` (a node id or
 * PA_WILD): the closure of those items alone. For the closed forms of constraint_count.c, which build the
 * configurations a counted repetition is made of and compare them with a real one by id. */
int32_t pda_enter(dsv4_cmatcher *m, const int32_t *pos, int32_t n, int32_t parent) {
    gen_next(m);
    for (int32_t i = 0; i < n; i++)
        if (add_parent(m, pos[i], parent)) return T_FAIL;
    return close_step(m, 0);
}

int32_t pda_step_special(dsv4_cmatcher *m, int32_t c, int32_t k) {
    const dsv4_grammar *g = m->g;
    int32_t *tr = m->cfg_strans[c];
    if (!tr) {
        if (!(tr = malloc(sizeof *tr * (size_t)g->n_special))) return T_FAIL;
        for (int32_t i = 0; i < g->n_special; i++) tr[i] = T_UNKNOWN;
        m->cfg_strans[c] = tr;
    }
    if (tr[k] != T_UNKNOWN) return tr[k];
    m->st.transitions++;
    gen_next(m);
    const int32_t len = cfg_len(m, c);
    for (int32_t i = 0; i < len; i++) {
        const cnode n = m->node[cfg_items(m, c)[i]];
        const gelem e = g->el[n.pos];
        if (e.kind == GE_TOKEN && e.arg == k && add_parent(m, n.pos + 1, n.parent)) return T_FAIL;
    }
    const int32_t next = close_step(m, 1);
    if (next == T_FAIL) return T_FAIL;
    m->cfg_strans[c][k] = next;
    return next;
}

/* ---- truncation -------------------------------------------------------------------------------------------- */

/* A max-heap of node ids in m->work. */
static int heap_push(ivec *h, int32_t x) {
    if (ivec_push(h, x)) return -1;
    for (int64_t i = h->n - 1; i > 0;) {
        const int64_t p = (i - 1) / 2;
        if (h->v[p] >= h->v[i]) break;
        const int32_t t = h->v[p]; h->v[p] = h->v[i]; h->v[i] = t;
        i = p;
    }
    return 0;
}

static int32_t heap_pop(ivec *h) {
    const int32_t top = h->v[0];
    h->v[0] = h->v[--h->n];
    for (int64_t i = 0;;) {
        const int64_t l = 2 * i + 1, r = l + 1;
        int64_t k = i;
        if (l < h->n && h->v[l] > h->v[k]) k = l;
        if (r < h->n && h->v[r] > h->v[k]) k = r;
        if (k == i) break;
        const int32_t t = h->v[k]; h->v[k] = h->v[i]; h->v[i] = t;
        i = k;
    }
    return top;
}

/* Every stack of c runs from a top down through strictly smaller node ids (a parent is interned before its
 * children). Expanding the largest id of the frontier first, a frontier of one node is a node on every stack,
 * and the first one found is the innermost. */
int32_t pda_truncate(dsv4_cmatcher *m, int32_t c, int64_t *ccut) {
    *ccut = 0;
    const int32_t len = cfg_len(m, c);
    if (len == 0) return c;
    ivec *heap = &m->work, *done = &m->ready;
    heap->n = done->n = 0;
    const uint32_t seen = ++m->stamp;
    for (int32_t i = 0; i < len; i++) {
        const int32_t t = cfg_items(m, c)[i];
        if (m->node_seen[t] != seen) {
            m->node_seen[t] = seen;
            if (heap_push(heap, t)) return T_FAIL;
        }
    }
    while (heap->n > 1) {
        const int32_t v = heap_pop(heap);
        if (ivec_push(done, v)) return T_FAIL;
        int32_t one, n;
        const int32_t *f = members(m, m->node[v].parent, &one, &n);
        for (int32_t i = 0; i < n; i++) {
            if (f[i] < 0) return c; /* this stack ends (or is already cut) without meeting the others */
            if (m->node_seen[f[i]] == seen) continue;
            m->node_seen[f[i]] = seen;
            if (heap_push(heap, f[i])) return T_FAIL;
        }
    }
    const int32_t common = heap->v[0], below = m->node[common].parent;
    if (below == PA_BOTTOM || below == PA_WILD) return c; /* nothing to cut */
    *ccut = parent_min(m, below);
    const int32_t base = node_get(m, m->node[common].pos, PA_WILD);
    if (base < 0) return T_FAIL;
    const uint32_t mapped = ++m->stamp;
    m->node_seen[common] = mapped;
    m->node_map[common] = base;
    for (int64_t i = done->n - 1; i >= 0; i--) {
        const int32_t u = done->v[i];
        int32_t one, n;
        const int32_t *f = members(m, m->node[u].parent, &one, &n);
        m->tmp.n = 0;
        for (int32_t j = 0; j < n; j++) {
            if (m->node_seen[f[j]] != mapped) return c; /* cannot happen: every frame below u leads to common */
            if (ivec_push(&m->tmp, m->node_map[f[j]])) return T_FAIL;
        }
        const int32_t nid = node_get(m, m->node[u].pos, parent_of(m));
        if (nid < 0) return T_FAIL;
        m->node_seen[u] = mapped;
        m->node_map[u] = nid;
    }
    m->acc.n = 0;
    for (int32_t i = 0; i < len; i++)
        if (ivec_push(&m->acc, m->node_map[cfg_items(m, c)[i]])) return T_FAIL;
    return cfg_get(m, 0, 0); /* a stack through `common` cannot end the whole output: not accepting */
}

/* ---- lifetime --------------------------------------------------------------------------------------------- */

/* Bytes that every byte set of the grammar either contains both or neither of: one class, whose transitions are
 * computed once (in a JSON string all the ordinary characters' bytes are one class). */
static int byte_classes(dsv4_cmatcher *m) {
    const dsv4_grammar *g = m->g;
    const int words = (g->n_sets + 63) / 64;
    uint64_t *sig = calloc((size_t)256 * (size_t)(words ? words : 1), sizeof *sig);
    if (!sig) return -1;
    for (int32_t k = 0; k < g->n_sets; k++)
        for (unsigned b = 0; b < 256; b++)
            if (gb_set_has(&g->sets[k], b)) sig[(size_t)b * words + k / 64] |= 1ULL << (k % 64);
    for (unsigned b = 0; b < 256; b++) {
        m->byte_rep[b] = (uint8_t)b;
        for (unsigned a = 0; a < b; a++)
            if (m->byte_rep[a] == a && !memcmp(sig + (size_t)a * words, sig + (size_t)b * words, sizeof *sig * (size_t)words)) {
                m->byte_rep[b] = (uint8_t)a;
                break;
            }
    }
    free(sig);
    return 0;
}

int pda_init(dsv4_cmatcher *m) {
    const dsv4_grammar *g = m->g;
    if (byte_classes(m)) return -1;
    const size_t n = (size_t)g->n_el;
    m->it_gen = calloc(n, sizeof *m->it_gen);
    m->it_head = malloc(sizeof *m->it_head * n);
    m->it_tail = malloc(sizeof *m->it_tail * n);
    m->it_done = malloc(sizeof *m->it_done * n);
    m->it_node = malloc(sizeof *m->it_node * n);
    m->it_flag = malloc(n);
    if (!m->it_gen || !m->it_head || !m->it_tail || !m->it_done || !m->it_node || !m->it_flag) return -1;
    /* the start: every alternative of the root rule, bottom of the stack */
    gen_next(m);
    for (int32_t a = g->alt_first[g->root]; a < g->alt_first[g->root + 1]; a++)
        if (add_ref(m, g->alt_pos[a], PA_BOTTOM)) return -1;
    return (m->start = close_step(m, 0)) < 0 ? -1 : 0;
}

void pda_free(dsv4_cmatcher *m) {
    for (int32_t c = 0; c < m->cf.n; c++) { free(m->cfg_trans[c]); free(m->cfg_strans[c]); }
    free(m->cfg_strans); free(m->special_id);
    free(m->node); free(m->node_min); free(m->node_seen); free(m->node_map); free(m->nh);
    lists_free(&m->ps); free(m->ps_min);
    lists_free(&m->cf);
    free(m->cfg_accept); free(m->cfg_escape); free(m->cfg_ci); free(m->cfg_min); free(m->cfg_trans); free(m->cfg_slot);
    free(m->it_gen); free(m->it_head); free(m->it_tail); free(m->it_done); free(m->it_node); free(m->it_flag);
    free(m->rv.v); free(m->rn.v); free(m->dk); free(m->dg);
    free(m->work.v); free(m->ready.v); free(m->acc.v); free(m->tmp.v);
}

size_t pda_bytes(const dsv4_cmatcher *m) {
    size_t b = (size_t)m->cap_node * (sizeof(cnode) + sizeof(int64_t) + 2 * sizeof(int32_t)) + (size_t)m->nh_cap * sizeof(int32_t);
    b += lists_bytes(&m->ps) + (size_t)m->ps.cap * sizeof(int64_t);
    b += lists_bytes(&m->cf) + (size_t)m->cf.cap * (sizeof(int64_t) + sizeof(int32_t) * 2 + 2 + sizeof(int32_t *));
    b += (size_t)m->n_trans_tables * 256 * sizeof(int32_t);
    b += (size_t)m->g->n_el * (sizeof(int32_t) * 5 + 1);
    b += (size_t)(m->rv.cap + m->rn.cap + m->work.cap + m->ready.cap + m->acc.cap + m->tmp.cap) * sizeof(int32_t);
    b += (size_t)m->d_cap * (sizeof(uint64_t) + sizeof(uint32_t));
    return b;
}
