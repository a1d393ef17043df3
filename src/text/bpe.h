/* Byte-level BPE on one pre-tokenized piece: start from one symbol per byte, repeatedly merge the adjacent pair
 * with the lowest merge rank (leftmost on ties), then emit the symbol ids. Implemented with a doubly linked
 * symbol list and a binary min-heap of candidate pairs keyed by (rank, position), with stale entries skipped
 * when popped, so a piece of n bytes costs O(n log n) however long it is (1 MB of one character included). */
#ifndef DSV4_TEXT_BPE_H
#define DSV4_TEXT_BPE_H
#include "text/hashmap.h"
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int32_t *v;
    size_t   n, cap;
    int      oom;
} dsv4_idvec;

void dsv4_idvec_push(dsv4_idvec *v, int32_t id);
void dsv4_idvec_free(dsv4_idvec *v);

typedef struct { int32_t rank, pos, left, right, merged; } dsv4_bpe_cand;

/* Work arrays reused across pieces; zero-initialize, free with dsv4_bpe_scratch_free. */
typedef struct {
    int32_t *id, *prev, *next;
    size_t   cap;
    dsv4_bpe_cand *heap;
    size_t   heap_n, heap_cap;
} dsv4_bpe_scratch;

void dsv4_bpe_scratch_free(dsv4_bpe_scratch *s);

/* Encode piece s[0..n) (n >= 1). byte_id[b] is the vocabulary id of the single-byte symbol for byte b.
 * Appends to out. Returns 0, or -1 when out of memory. */
int dsv4_bpe_encode(const dsv4_pairmap *merges, const int32_t byte_id[256], const unsigned char *s, size_t n,
                    dsv4_bpe_scratch *sc, dsv4_idvec *out);
#endif
