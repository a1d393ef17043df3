/* Two small open-addressing hash tables the tokenizer needs: byte string -> id (vocabulary, added tokens) and
 * (left id, right id) -> (merge rank, merged id). Both are built once at load time and read-only afterwards,
 * so lookups are safe from several threads. Keys of the string map are borrowed, not copied. */
#ifndef DSV4_TEXT_HASHMAP_H
#define DSV4_TEXT_HASHMAP_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *key;    /* borrowed; NULL = empty slot */
    uint32_t    len;
    int32_t     value;
} dsv4_strmap_slot;

typedef struct {
    dsv4_strmap_slot *slots;
    size_t mask;        /* capacity - 1 (capacity is a power of two) */
    size_t count;
} dsv4_strmap;

int     dsv4_strmap_init(dsv4_strmap *m, size_t expected);   /* 0 on success, -1 out of memory */
void    dsv4_strmap_free(dsv4_strmap *m);
/* Insert or overwrite. The key memory must outlive the map. Returns -1 when the map is full. */
int     dsv4_strmap_put(dsv4_strmap *m, const char *key, size_t len, int32_t value);
/* The value, or -1 when absent. */
int32_t dsv4_strmap_get(const dsv4_strmap *m, const char *key, size_t len);

typedef struct {
    uint64_t key;       /* (left << 32) | right; UINT64_MAX = empty */
    int32_t  rank;
    int32_t  merged;
} dsv4_pairmap_slot;

typedef struct {
    dsv4_pairmap_slot *slots;
    size_t mask;
    size_t count;
} dsv4_pairmap;

int  dsv4_pairmap_init(dsv4_pairmap *m, size_t expected);
void dsv4_pairmap_free(dsv4_pairmap *m);
/* Keeps the first (lowest-rank) entry when a pair is inserted twice, as a rank table should. */
int  dsv4_pairmap_put(dsv4_pairmap *m, int32_t left, int32_t right, int32_t rank, int32_t merged);
/* NULL when the pair has no merge. */
const dsv4_pairmap_slot *dsv4_pairmap_get(const dsv4_pairmap *m, int32_t left, int32_t right);
#endif
