/* Companions of prefix-cache entries: a state that belongs with a stored sequence state and is stored, evicted
 * and charged to the budget with it. Speculative drafters that are fed the target's features of every committed
 * position (V4 MTP, DSpark) keep theirs here, so that a speculating stream can fork from the cache and still get
 * exactly the drafter a full prefill would have built (engine/speculative.h, dsv4_drafter.prefix_save).
 *
 * A companion is owned by the cache once given to prefix_cache_put_with; `free` releases it (the struct is the
 * head of its owner's own record). Lookups ask for one kind. A companion with a codec is also written to the
 * disk tier, in a file of its own beside the state file (format below), and a lookup given the codec loads it
 * back from there; without a codec it lives in memory only. */
#ifndef DSV4_STATE_PREFIX_COMPANION_H
#define DSV4_STATE_PREFIX_COMPANION_H
#include "dsv4.h"
#include <stddef.h>
#include <stdint.h>

struct prefix_companion;

/* How one kind of companion becomes bytes and back (the drafter's own payload format; the file around it is
 * prefix_companion_file_*). encode: a malloc'd payload. decode: a new companion for the entry whose tokens are
 * tokens[0..pos) on model m, or a one-line error when the payload does not fit that model or position (the file
 * was checked for damage before: its checksum, kind, model and position matched). */
typedef struct prefix_codec {
    const char *kind;                               /* the drafter's name: [a-z0-9_], 1..15 characters */
    int (*encode)(const struct prefix_companion *c, void **buf, size_t *len, dsv4_error *err);
    int (*decode)(dsv4_model *m, const int32_t *tokens, int64_t pos, const void *buf, size_t len,
                  struct prefix_companion **out, dsv4_error *err);
} prefix_codec;

typedef struct prefix_companion {
    const char *kind;                               /* static: the drafter's name */
    size_t bytes;                                   /* charged to the cache's budget */
    void (*free)(struct prefix_companion *self);
    struct prefix_companion *next;                  /* the entry's list (the cache's) */
    const prefix_codec *codec;                      /* NULL: memory only; else codec->kind == kind */
} prefix_companion;

/* dsv4_prefix_cache_put, then attach comp (NULL: none) to the stored entry unless it has one of that kind
 * already or it does not fit; with a disk tier and a codec, comp is also written there. Takes ownership of comp
 * in every case (freed when not kept). */
int prefix_cache_put_with(dsv4_prefix_cache *c, const dsv4_seq *s, prefix_companion *comp, dsv4_error *err);
/* dsv4_prefix_cache_lookup among the entries that have a companion of this kind (kind NULL: every entry, disk
 * included, and *comp = NULL). The disk tier serves such a lookup only with codec (the kind's, to decode the
 * file): otherwise memory only. On a hit *comp is the entry's companion, borrowed until the next call on c. */
int prefix_cache_lookup_with(dsv4_prefix_cache *c, dsv4_model *m, const int32_t *tokens, int64_t n, const char *kind,
                             const prefix_codec *codec, dsv4_seq **out, int64_t *matched, const prefix_companion **comp,
                             dsv4_error *err);

/* ---- companion files --------------------------------------------------------------------------------------
 *
 * Format version 1, little-endian, no padding:
 *   magic "DSV4CMP\x1a" (8) | u32 version | char kind[16] (NUL-padded) | u64 model fingerprint
 *   | u32 numeric mode | u32 kv storage word (persist.h) | i64 position P | u64 XXH64 (seed 0) of tokens[0..P)
 *   | u64 payload bytes | payload (the codec's) | u64 XXH64 (seed 0) of every byte before it
 * The header fixes the file's length; kind, model (fingerprint, mode, KV format), position and tokens must be the
 * entry's, so a companion never pairs with another state than the one it was saved with. */
#define PREFIX_COMPANION_MAGIC "DSV4CMP\x1a"
#define PREFIX_COMPANION_VERSION 1u
#define PREFIX_COMPANION_HEADER 68
#define PREFIX_COMPANION_KIND 16

/* The whole file for a payload (malloc'd into *buf). */
int prefix_companion_file_build(const char *kind, const dsv4_model *m, const int32_t *tokens, int64_t pos,
                                const void *payload, size_t payload_len, void **buf, size_t *len, dsv4_error *err);
/* Check a file's bytes against what the entry expects; on success the payload is buf[*off .. *off + *plen). */
int prefix_companion_file_check(const void *buf, size_t len, const char *kind, const dsv4_model *m,
                                const int32_t *tokens, int64_t pos, size_t *off, size_t *plen, dsv4_error *err);
/* Read, check and decode a companion file: a new companion, or a one-line error naming the file. */
int prefix_companion_file_load(const char *path, const prefix_codec *codec, dsv4_model *m, const int32_t *tokens,
                               int64_t pos, prefix_companion **out, dsv4_error *err);
/* Encode comp (which must have a codec) and write its file atomically. */
int prefix_companion_file_save(const char *path, const prefix_companion *comp, const dsv4_model *m,
                               const int32_t *tokens, int64_t pos, dsv4_error *err);
#endif
