/* The prefix cache's on-disk tier (prefix_disk.c). */
#ifndef DSV4_STATE_PREFIX_DISK_H
#define DSV4_STATE_PREFIX_DISK_H
#include "dsv4.h"
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *dir;                  /* NULL: no disk tier */
    size_t budget, bytes;
    int64_t hits, writes, rejected, evictions;
} prefix_disk;

int  prefix_disk_init(prefix_disk *d, const char *dir, size_t budget, dsv4_error *err);
void prefix_disk_free(prefix_disk *d);
/* Write s's state (unless stored already) and evict beyond the budget. */
int  prefix_disk_put(prefix_disk *d, const dsv4_seq *s, dsv4_error *err);
/* The longest stored prefix of tokens[0..n) longer than longer_than tokens, loaded into *out (NULL: none). */
int  prefix_disk_lookup(prefix_disk *d, dsv4_model *m, const int32_t *tokens, int64_t n, int64_t longer_than,
                        dsv4_seq **out, dsv4_error *err);
#endif
