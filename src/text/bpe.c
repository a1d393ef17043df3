#include "text/bpe.h"
#include <stdlib.h>

void dsv4_idvec_push(dsv4_idvec *v, int32_t id) {
    if (v->oom) return;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->v, cap * sizeof *p);
        if (!p) { v->oom = 1; return; }
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = id;
}

void dsv4_idvec_free(dsv4_idvec *v) {
    free(v->v);
    v->v = NULL;
    v->n = v->cap = 0;
    v->oom = 0;
}

void dsv4_bpe_scratch_free(dsv4_bpe_scratch *s) {
    free(s->id); free(s->prev); free(s->next); free(s->heap);
    s->id = s->prev = s->next = NULL;
    s->heap = NULL;
    s->cap = s->heap_n = s->heap_cap = 0;
}

static int grow(void **p, size_t n, size_t elem) {
    void *q = realloc(*p, n * elem);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int reserve(dsv4_bpe_scratch *s, size_t n) {
    if (n > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < n) cap *= 2;
        if (grow((void **)&s->id, cap, sizeof *s->id) || grow((void **)&s->prev, cap, sizeof *s->prev) ||
            grow((void **)&s->next, cap, sizeof *s->next))
            return -1;
        s->cap = cap;
    }
    return 0;
}

static inline int cand_less(const dsv4_bpe_cand *a, const dsv4_bpe_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(dsv4_bpe_scratch *s, dsv4_bpe_cand c) {
    if (s->heap_n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 128;
        if (grow((void **)&s->heap, cap, sizeof *s->heap)) return -1;
        s->heap_cap = cap;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_less(&c, &s->heap[parent])) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = c;
    return 0;
}

static dsv4_bpe_cand heap_pop(dsv4_bpe_scratch *s) {
    dsv4_bpe_cand top = s->heap[0];
    dsv4_bpe_cand last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const dsv4_bpe_cand *best = &last;
        if (l < n && cand_less(&s->heap[l], best)) { m = l; best = &s->heap[l]; }
        if (r < n && cand_less(&s->heap[r], best)) { m = r; }
        if (m == i) break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (n) s->heap[i] = last;
    return top;
}

/* Queue the pair starting at symbol i, if it has a merge. */
static int push_pair(const dsv4_pairmap *merges, dsv4_bpe_scratch *s, int32_t i) {
    if (i < 0) return 0;
    int32_t j = s->next[i];
    if (j < 0) return 0;
    const dsv4_pairmap_slot *m = dsv4_pairmap_get(merges, s->id[i], s->id[j]);
    if (!m) return 0;
    dsv4_bpe_cand c = {m->rank, i, s->id[i], s->id[j], m->merged};
    return heap_push(s, c);
}

int dsv4_bpe_encode(const dsv4_pairmap *merges, const int32_t byte_id[256], const unsigned char *str, size_t n,
                    dsv4_bpe_scratch *s, dsv4_idvec *out) {
    if (n == 1) { dsv4_idvec_push(out, byte_id[str[0]]); return out->oom ? -1 : 0; }
    if (n > INT32_MAX || reserve(s, n)) return -1;
    for (size_t i = 0; i < n; i++) {
        s->id[i] = byte_id[str[i]];
        s->prev[i] = (int32_t)i - 1;
        s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (push_pair(merges, s, (int32_t)i)) return -1;
    while (s->heap_n) {
        dsv4_bpe_cand c = heap_pop(s);
        /* Skip stale candidates: a symbol's string only grows when it merges, so if both ids are still the
         * ones recorded, the pair is still exactly this pair. Merged-away symbols have id -1. */
        int32_t i = c.pos;
        if (s->id[i] != c.left) continue;
        int32_t j = s->next[i];
        if (j < 0 || s->id[j] != c.right) continue;
        s->id[i] = c.merged;
        s->id[j] = -1;
        s->next[i] = s->next[j];
        if (s->next[j] >= 0) s->prev[s->next[j]] = i;
        if (push_pair(merges, s, s->prev[i]) || push_pair(merges, s, i)) return -1;
    }
    for (int32_t i = 0; i >= 0; i = s->next[i]) dsv4_idvec_push(out, s->id[i]);
    return out->oom ? -1 : 0;
}
