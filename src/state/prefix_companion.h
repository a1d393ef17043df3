/* Companions of prefix-cache entries: a state that belongs with a stored sequence state and is stored, evicted
 * and charged to the budget with it. Speculative drafters that are fed the target's features of every committed
 * position (V4 MTP, DSpark) keep theirs here, so that a speculating stream can fork from the cache and still get
 * exactly the drafter a full prefill would have built (engine/speculative.h, dsv4_drafter.prefix_save).
 *
 * A companion is owned by the cache once given to prefix_cache_put_with; `free` releases it (the struct is the
 * head of its owner's own record). Lookups ask for one kind; the on-disk tier keeps no companions, so a lookup
 * that needs one is served from memory only. */
#ifndef DSV4_STATE_PREFIX_COMPANION_H
#define DSV4_STATE_PREFIX_COMPANION_H
#include "dsv4.h"
#include <stddef.h>
#include <stdint.h>

typedef struct prefix_companion {
    const char *kind;                               /* static: the drafter's name */
    size_t bytes;                                   /* charged to the cache's budget */
    void (*free)(struct prefix_companion *self);
    struct prefix_companion *next;                  /* the entry's list (the cache's) */
} prefix_companion;

/* dsv4_prefix_cache_put, then attach comp (NULL: none) to the stored entry unless it has one of that kind
 * already or it does not fit. Takes ownership of comp in every case (freed when not kept). */
int prefix_cache_put_with(dsv4_prefix_cache *c, const dsv4_seq *s, prefix_companion *comp, dsv4_error *err);
/* dsv4_prefix_cache_lookup among the entries that have a companion of this kind (kind NULL: every entry, disk
 * included, and *comp = NULL). On a hit *comp is the entry's companion, borrowed until the next call on c. */
int prefix_cache_lookup_with(dsv4_prefix_cache *c, dsv4_model *m, const int32_t *tokens, int64_t n, const char *kind,
                             dsv4_seq **out, int64_t *matched, const prefix_companion **comp, dsv4_error *err);
#endif
