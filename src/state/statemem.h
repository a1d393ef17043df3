/* Where a sequence's state lives (DESIGN §8: "state is plain data on whichever device holds it").
 *
 * Every buffer of a sequence that grows or is copied — window rings, compressor rings, compressed and indexer
 * rows — is allocated, copied and released through one of these tables, so the state code (sequence.c,
 * persist.c, fork, rollback, the prefix cache) is the same for host and device sequences. The token history
 * and every count stay in host memory: only the bulk bytes move.
 *
 * A table is immutable and shared; it holds no state of its own. */
#ifndef DSV4_STATE_STATEMEM_H
#define DSV4_STATE_STATEMEM_H
#include <stddef.h>

typedef struct seq_mem {
    const char *name;                                         /* "cpu", "cuda" */
    void *(*alloc)(size_t bytes);                             /* zero-filled, NULL when out of memory */
    void  (*release)(void *p);                                /* NULL is a no-op */
    void  (*copy)(void *dst, const void *src, size_t n);      /* both in this memory */
    void  (*to_host)(void *host, const void *src, size_t n);  /* src in this memory */
    void  (*from_host)(void *dst, const void *host, size_t n);/* dst in this memory */
} seq_mem;

/* Host memory (calloc / free / memcpy). */
extern const seq_mem seq_mem_host;

/* Grow a buffer of this memory from `old_bytes` (kept) to `new_bytes`; NULL on failure (the old one stays). */
void *seq_mem_grow(const seq_mem *m, void *p, size_t old_bytes, size_t new_bytes);
#endif
