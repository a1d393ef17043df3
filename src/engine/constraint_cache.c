/* A cache of matchers keyed by grammar: see constraint_cache.h. */
#include "engine/constraint_cache.h"
#include "util/error.h"
#include <stdlib.h>

typedef struct {
    dsv4_grammar *g;             /* owned copy: the matcher borrows it */
    const dsv4_cvocab *v;
    dsv4_cmatcher *m;
    uint64_t hash, last;
    int pins;
} centry;

struct dsv4_cmcache {
    centry *e;
    int n, cap, max;
    size_t budget;
    uint64_t clock;
    int64_t hits;
};

int dsv4_cmcache_new(size_t budget_bytes, int max_entries, dsv4_cmcache **out, dsv4_error *err) {
    *out = NULL;
    if (max_entries < 1) return dsv4_fail(err, DSV4_E_ARG, "matcher cache: max_entries must be >= 1");
    dsv4_cmcache *c = calloc(1, sizeof *c);
    if (c) c->e = calloc((size_t)max_entries, sizeof *c->e);
    if (!c || !c->e) { free(c); return dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); }
    c->cap = c->max = max_entries;
    c->budget = budget_bytes;
    *out = c;
    return 0;
}

static void drop(dsv4_cmcache *c, int i) {
    dsv4_cmatcher_free(c->e[i].m);
    dsv4_grammar_free(c->e[i].g);
    c->e[i] = c->e[--c->n];
}

void dsv4_cmcache_free(dsv4_cmcache *c) {
    if (!c) return;
    while (c->n > 0) drop(c, c->n - 1);
    free(c->e);
    free(c);
}

/* Drop unpinned entries, least recently used first, until `want` more fit (entries and bytes). */
static void make_room(dsv4_cmcache *c, int want) {
    for (;;) {
        size_t bytes = 0;
        int victim = -1;
        for (int i = 0; i < c->n; i++) {
            bytes += dsv4_cmatcher_bytes(c->e[i].m);
            if (!c->e[i].pins && (victim < 0 || c->e[i].last < c->e[victim].last)) victim = i;
        }
        if (victim < 0 || (c->n + want <= c->max && bytes <= c->budget)) return;
        drop(c, victim);
    }
}

int dsv4_cmcache_get(dsv4_cmcache *c, const dsv4_grammar *g, const dsv4_cvocab *v, dsv4_cmatcher **out, dsv4_error *err) {
    *out = NULL;
    const uint64_t h = dsv4_grammar_hash(g);
    for (int i = 0; i < c->n; i++)
        if (c->e[i].hash == h && c->e[i].v == v && dsv4_grammar_same(c->e[i].g, g)) {
            c->e[i].pins++;
            c->e[i].last = ++c->clock;
            c->hits++;
            *out = c->e[i].m;
            return 0;
        }
    make_room(c, 1);
    dsv4_grammar *copy = dsv4_grammar_copy(g);
    if (!copy) return dsv4_fail(err, DSV4_E_NOMEM, "out of memory");
    dsv4_cmatcher *m;
    const int rc = dsv4_cmatcher_new(copy, v, &m, err);
    if (rc) { dsv4_grammar_free(copy); return rc; }
    if (c->n == c->cap) { /* every entry is pinned: go past max_entries until releases bring it back */
        centry *e = realloc(c->e, sizeof *e * (size_t)(2 * c->cap));
        if (!e) { dsv4_cmatcher_free(m); dsv4_grammar_free(copy); return dsv4_fail(err, DSV4_E_NOMEM, "out of memory"); }
        c->e = e;
        c->cap *= 2;
    }
    c->e[c->n++] = (centry){ copy, v, m, h, ++c->clock, 1 };
    *out = m;
    return 0;
}

void dsv4_cmcache_release(dsv4_cmcache *c, dsv4_cmatcher *m) {
    if (!c || !m) return;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].m == m) {
            if (c->e[i].pins > 0) c->e[i].pins--;
            break;
        }
    make_room(c, 0);
}

int dsv4_cmcache_entries(const dsv4_cmcache *c) { return c->n; }
int64_t dsv4_cmcache_hits(const dsv4_cmcache *c) { return c->hits; }
