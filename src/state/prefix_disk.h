/* The prefix cache's on-disk tier (prefix_disk.c). */
#ifndef DSV4_STATE_PREFIX_DISK_H
#define DSV4_STATE_PREFIX_DISK_H
#include "dsv4.h"
#include "state/prefix_companion.h"
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *dir;                  /* NULL: no disk tier */
    size_t budget, bytes;
    int64_t hits, writes, rejected, evictions;
} prefix_disk;

int  prefix_disk_init(prefix_disk *d, const char *dir, size_t budget, dsv4_error *err);
void prefix_disk_free(prefix_disk *d);
/* Write s's state (unless stored already) and, when comp has a codec, its companion file (unless stored already;
 * not when the two cannot fit the budget together), then evict beyond the budget. */
int  prefix_disk_put(prefix_disk *d, const dsv4_seq *s, const prefix_companion *comp, dsv4_error *err);
/* The longest stored prefix of tokens[0..n) longer than longer_than tokens, loaded into *out (NULL: none). With a
 * codec only entries with a companion of its kind count, and *comp receives the decoded companion (owned by the
 * caller); a damaged or foreign state or companion file is removed and the next candidate tried. */
int  prefix_disk_lookup(prefix_disk *d, dsv4_model *m, const int32_t *tokens, int64_t n, int64_t longer_than,
                        const prefix_codec *codec, dsv4_seq **out, prefix_companion **comp, dsv4_error *err);
/* The file names of an entry: its state, and its companion of a kind. */
void prefix_disk_state_path(char *out, size_t size, const char *dir, uint64_t fingerprint, const int32_t *tokens, int64_t n);
void prefix_disk_companion_path(char *out, size_t size, const char *dir, uint64_t fingerprint, const int32_t *tokens,
                                int64_t n, const char *kind);
#endif
