/* In-memory prefix cache: a list of stored sequence states in least-recently-used order, with a byte budget.
 *
 * An entry is a fork of a sequence; its key is the sequence's own token history and its model. Lookup scans
 * every entry for the longest one whose history is a prefix of the request (entries are few and the compare
 * is a memcmp; a token trie is a later optimisation). Each entry is charged its serialised size
 * (dsv4_seq_state_bytes), which tracks the state's real memory (the ring's dead slots and row slack aside).
 * An entry may carry companions (prefix_companion.h: a speculative drafter's state at the same position), charged
 * with it and dropped with it; those with a codec are written to the disk tier beside the state and come back
 * with it on a disk hit.
 * Not thread-safe: one cache per scheduler thread. */
#include "model/model.h"
#include "state/prefix_companion.h"
#include "state/prefix_disk.h"
#include "state/sequence.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    dsv4_seq *seq;
    prefix_companion *comp;      /* owned list, at most one per kind */
    size_t bytes;                /* the state's and its companions' */
    struct entry *prev, *next;   /* prev = more recently used */
} entry;

struct dsv4_prefix_cache {
    entry *head, *tail;          /* head = most recently used */
    dsv4_prefix_cache_stats st;
    prefix_disk disk;            /* optional on-disk tier (prefix_disk.c) */
    prefix_companion *loose;     /* a companion loaded from disk that memory could not keep: the last lookup's
                                    borrowed result, freed by the next call */
};

int dsv4_prefix_cache_new(size_t budget_bytes, dsv4_prefix_cache **out, dsv4_error *err) {
    if (!out) return dsv4_fail(err, DSV4_E_ARG, "prefix cache: missing output");
    dsv4_prefix_cache *c = calloc(1, sizeof *c);
    if (!c) return dsv4_fail(err, DSV4_E_NOMEM, "prefix cache: out of memory");
    c->st.budget = budget_bytes;
    *out = c;
    return 0;
}

static void unlink_entry(dsv4_prefix_cache *c, entry *e) {
    if (e->prev) e->prev->next = e->next; else c->head = e->next;
    if (e->next) e->next->prev = e->prev; else c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(dsv4_prefix_cache *c, entry *e) {
    e->prev = NULL;
    e->next = c->head;
    if (c->head) c->head->prev = e; else c->tail = e;
    c->head = e;
}

static void drop(dsv4_prefix_cache *c, entry *e) {
    unlink_entry(c, e);
    c->st.bytes -= e->bytes;
    c->st.entries--;
    dsv4_seq_free(e->seq);
    while (e->comp) {
        prefix_companion *next = e->comp->next;
        e->comp->free(e->comp);
        e->comp = next;
    }
    free(e);
}

static prefix_companion *companion_of(const entry *e, const char *kind) {
    for (prefix_companion *p = e->comp; p; p = p->next)
        if (!strcmp(p->kind, kind)) return p;
    return NULL;
}

static void free_loose(dsv4_prefix_cache *c) {
    if (c->loose) c->loose->free(c->loose);
    c->loose = NULL;
}

void dsv4_prefix_cache_free(dsv4_prefix_cache *c) {
    if (!c) return;
    free_loose(c);
    while (c->head) drop(c, c->head);
    prefix_disk_free(&c->disk);
    free(c);
}

static int same_history(const dsv4_seq *a, const dsv4_seq *b) {
    return a->model == b->model && a->pos == b->pos &&
           (a->pos == 0 || !memcmp(a->tokens, b->tokens, sizeof(int32_t) * (size_t)a->pos));
}

/* *stored: the entry that holds s's history now (NULL when it could not fit) */
static int memory_put(dsv4_prefix_cache *c, const dsv4_seq *s, entry **stored, dsv4_error *err);

int dsv4_prefix_cache_put(dsv4_prefix_cache *c, const dsv4_seq *s, dsv4_error *err) {
    return prefix_cache_put_with(c, s, NULL, err);
}

/* Keep comp with entry e when e has none of its kind (an equal history gives an equal companion: the first one
 * stays) and both fit; e is the most recent, so eviction takes others. 1: kept (owned by e), 0: not (the
 * caller's still). */
static int attach(dsv4_prefix_cache *c, entry *e, prefix_companion *comp) {
    if (!e || companion_of(e, comp->kind) || e->bytes + comp->bytes > c->st.budget) return 0;
    while (c->tail != e && c->st.bytes + comp->bytes > c->st.budget) {
        drop(c, c->tail);
        c->st.evictions++;
    }
    comp->next = e->comp;
    e->comp = comp;
    e->bytes += comp->bytes;
    c->st.bytes += comp->bytes;
    return 1;
}

int prefix_cache_put_with(dsv4_prefix_cache *c, const dsv4_seq *s, prefix_companion *comp, dsv4_error *err) {
    if (!c || !s) {
        if (comp) comp->free(comp);
        return dsv4_fail(err, DSV4_E_ARG, "prefix cache: missing cache or sequence");
    }
    free_loose(c);
    entry *e = NULL;
    int rc = memory_put(c, s, &e, err);
    if (!rc) rc = prefix_disk_put(&c->disk, s, comp, err);
    if (comp && (rc || !attach(c, e, comp))) comp->free(comp);
    return rc;
}

static int memory_put(dsv4_prefix_cache *c, const dsv4_seq *s, entry **stored, dsv4_error *err) {
    *stored = NULL;
    for (entry *e = c->head; e; e = e->next)
        if (same_history(e->seq, s)) {
            unlink_entry(c, e);
            push_front(c, e);
            *stored = e;
            return 0;
        }
    const size_t bytes = dsv4_seq_state_bytes(s);
    if (bytes > c->st.budget) return 0;   /* could never fit: not an error, just not cached */
    entry *e = calloc(1, sizeof *e);
    if (!e) return dsv4_fail(err, DSV4_E_NOMEM, "prefix cache: out of memory");
    int rc = dsv4_seq_fork(s, &e->seq, err);
    if (rc) { free(e); return rc; }
    e->bytes = bytes;
    while (c->tail && c->st.bytes + bytes > c->st.budget) {
        drop(c, c->tail);
        c->st.evictions++;
    }
    push_front(c, e);
    c->st.bytes += bytes;
    c->st.entries++;
    *stored = e;
    return 0;
}

int dsv4_prefix_cache_lookup(dsv4_prefix_cache *c, dsv4_model *m, const int32_t *tokens, int64_t n, dsv4_seq **out,
                             int64_t *matched, dsv4_error *err) {
    return prefix_cache_lookup_with(c, m, tokens, n, NULL, NULL, out, matched, NULL, err);
}

int prefix_cache_lookup_with(dsv4_prefix_cache *c, dsv4_model *m, const int32_t *tokens, int64_t n, const char *kind,
                             const prefix_codec *codec, dsv4_seq **out, int64_t *matched, const prefix_companion **comp,
                             dsv4_error *err) {
    if (comp) *comp = NULL;
    if (!c || !m || !out || !matched || (n > 0 && !tokens) || (kind && !comp) || (codec && (!kind || strcmp(codec->kind, kind))))
        return dsv4_fail(err, DSV4_E_ARG, "prefix cache: missing argument");
    free_loose(c);
    entry *best = NULL;
    for (entry *e = c->head; e; e = e->next) {
        const dsv4_seq *s = e->seq;
        if (s->model != m || s->pos > n || (best && s->pos <= best->seq->pos) || (kind && !companion_of(e, kind))) continue;
        if (s->pos > 0 && !memcmp(s->tokens, tokens, sizeof(int32_t) * (size_t)s->pos)) best = e;
    }
    int rc;
    /* the disk tier serves when it holds a longer prefix than memory (another process, or this one before a
     * restart or an eviction, may have stored it); a lookup for a kind needs the kind's codec to read it there */
    dsv4_seq *from_disk = NULL;
    prefix_companion *disk_comp = NULL;
    if ((!kind || codec) &&
        (rc = prefix_disk_lookup(&c->disk, m, tokens, n, best ? best->seq->pos : 0, codec, &from_disk, &disk_comp, err)))
        return rc;
    if (from_disk) {
        *out = from_disk;
        *matched = dsv4_seq_position(from_disk);
        c->st.hits++;
        /* keep it close for the next request; when memory cannot, the hit stands all the same */
        entry *kept;
        dsv4_error merr;
        if (memory_put(c, from_disk, &kept, &merr)) kept = NULL;
        if (disk_comp) {
            if (!attach(c, kept, disk_comp)) c->loose = disk_comp;
            *comp = disk_comp;
        }
        return 0;
    }
    if (best && best->seq->pos > 0) {
        if ((rc = dsv4_seq_fork(best->seq, out, err))) return rc;
        unlink_entry(c, best);
        push_front(c, best);
        *matched = best->seq->pos;
        if (kind) *comp = companion_of(best, kind);
        c->st.hits++;
        return 0;
    }
    if ((rc = dsv4_seq_new(m, out, err))) return rc;
    *matched = 0;
    c->st.misses++;
    return 0;
}

void dsv4_prefix_cache_get_stats(const dsv4_prefix_cache *c, dsv4_prefix_cache_stats *st) {
    *st = c->st;
    st->disk_hits = c->disk.hits;
    st->disk_writes = c->disk.writes;
    st->disk_rejected = c->disk.rejected;
    st->disk_evictions = c->disk.evictions;
    st->disk_bytes = c->disk.bytes;
    st->disk_budget = c->disk.budget;
}

int dsv4_prefix_cache_set_dir(dsv4_prefix_cache *c, const char *dir, size_t budget_bytes, dsv4_error *err) {
    if (!c) return dsv4_fail(err, DSV4_E_ARG, "prefix cache: missing cache");
    prefix_disk_free(&c->disk);
    return prefix_disk_init(&c->disk, dir, budget_bytes, err);
}
