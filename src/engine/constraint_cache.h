/* Matchers shared across requests with the same grammar (the scheduler keeps one of these).
 *
 * A matcher's tables and mask caches are what make masks fast (constraint.h); a request that builds a private
 * matcher pays every first walk again. This cache keys matchers by the grammar they were built for (structural
 * equality: the same schema compiles to the same grammar), so the second request with a schema finds them
 * warm. Each entry owns a copy of its grammar; the caller's grammar is only read.
 *
 * Lifetime: dsv4_cmcache_get pins the matcher until the matching dsv4_cmcache_release (the states built on it
 * must be freed first). Unpinned entries are dropped least recently used first when there are more than
 * max_entries or their matchers hold more than budget_bytes together (matcher tables only grow). Not
 * thread-safe: one thread uses the cache and every matcher from it (as the scheduler does). */
#ifndef DSV4_ENGINE_CONSTRAINT_CACHE_H
#define DSV4_ENGINE_CONSTRAINT_CACHE_H
#include "engine/constraint.h"

typedef struct dsv4_cmcache dsv4_cmcache;

int  dsv4_cmcache_new(size_t budget_bytes, int max_entries, dsv4_cmcache **out, dsv4_error *err);
void dsv4_cmcache_free(dsv4_cmcache *c);
/* The matcher for (g, v), cached or new; pinned. */
int  dsv4_cmcache_get(dsv4_cmcache *c, const dsv4_grammar *g, const dsv4_cvocab *v, dsv4_cmatcher **out, dsv4_error *err);
void dsv4_cmcache_release(dsv4_cmcache *c, dsv4_cmatcher *m);
/* Entries now, and how many gets found their matcher cached. */
int  dsv4_cmcache_entries(const dsv4_cmcache *c);
int64_t dsv4_cmcache_hits(const dsv4_cmcache *c);
#endif
